package sessionlake.hadoop;

import java.io.IOException;
import java.net.URI;
import java.net.URISyntaxException;
import java.nio.file.FileSystemException;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.ChecksumFs;
import org.apache.hadoop.fs.DelegateToFileSystem;
import org.apache.hadoop.fs.FileAlreadyExistsException;
import org.apache.hadoop.fs.FsConstants;
import org.apache.hadoop.fs.FsServerDefaults;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.local.LocalConfigKeys;

/**
 * The {@code file:} scheme's {@link org.apache.hadoop.fs.AbstractFileSystem}
 * ({@code fs.AbstractFileSystem.file.impl}), behind Hadoop's {@code FileContext}: Delta's
 * commits and Spark's streaming checkpoint write through it. Hadoop's own
 * ({@code org.apache.hadoop.fs.local.LocalFs}) is the same but over Hadoop's raw local file
 * system, which it creates itself; and its rename without overwrite checks that the target
 * is absent and then renames, which replaces a target another process created in between.
 * Delta commits a version by such a rename, and relies on it failing for all writers but
 * one: Hadoop's let two processes (a stream and a maintenance command beside it) both
 * "commit" the same version, the second file replacing the first, which was lost. Here a
 * file is renamed without overwrite by a hard link, which the kernel refuses at once when
 * the target exists.
 */
public class LocalFs extends ChecksumFs {

  public LocalFs(URI uri, Configuration conf) throws IOException, URISyntaxException {
    super(new Raw(uri, conf));
  }

  /** As {@code org.apache.hadoop.fs.local.RawLocalFs}, over {@link RawLocalFileSystem}. */
  static final class Raw extends DelegateToFileSystem {

    Raw(URI uri, Configuration conf) throws IOException, URISyntaxException {
      super(uri, new RawLocalFileSystem(), conf, FsConstants.LOCAL_FS_URI.getScheme(), false);
    }

    @Override
    public int getUriDefaultPort() {
      return -1;
    }

    @Override
    public FsServerDefaults getServerDefaults(Path f) throws IOException {
      return LocalConfigKeys.getServerDefaults();
    }

    @Override
    @Deprecated
    public FsServerDefaults getServerDefaults() throws IOException {
      return LocalConfigKeys.getServerDefaults();
    }

    @Override
    public boolean isValidName(String src) {
      return true;
    }

    /**
     * A file renamed without {@code overwrite}: linked to its new name, then unlinked from
     * its old one, so that of two writers racing for one name exactly one succeeds and the
     * other gets {@link FileAlreadyExistsException}. A folder, or a file system without
     * hard links, is renamed as Hadoop does.
     */
    @Override
    public void renameInternal(Path src, Path dst, boolean overwrite) throws IOException {
      RawLocalFileSystem local = (RawLocalFileSystem) fsImpl;
      java.nio.file.Path from = local.pathToFile(src).toPath();
      if (overwrite || !Files.isRegularFile(from, LinkOption.NOFOLLOW_LINKS)) {
        super.renameInternal(src, dst, overwrite);
        return;
      }
      try {
        Files.createLink(local.pathToFile(dst).toPath(), from);
      } catch (java.nio.file.FileAlreadyExistsException e) {
        throw new FileAlreadyExistsException("rename destination " + dst + " already exists.");
      } catch (UnsupportedOperationException | FileSystemException e) {
        super.renameInternal(src, dst, false); // no hard links here, or no such folder
        return;
      }
      Files.delete(from);
    }
  }
}
