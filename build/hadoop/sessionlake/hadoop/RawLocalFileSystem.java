package sessionlake.hadoop;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermissions;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.permission.FsPermission;

/**
 * Hadoop's local file system without a child process per file.
 *
 * <p>Without Hadoop's native library (which pip's Spark does not bring), Hadoop's local file
 * system runs {@code chmod} for every file it creates and {@code readlink} for every rename:
 * a micro-batch's Parquet files, Delta commits, checksums and streaming checkpoint files.
 * That was about 200 processes per batch, each forked from the driver's JVM. These two
 * calls are answered here with {@link java.nio.file.Files}, which gives the same result; a
 * sticky bit and real symbolic links are left to Hadoop.
 */
public class RawLocalFileSystem extends org.apache.hadoop.fs.RawLocalFileSystem {

  @Override
  public void setPermission(Path p, FsPermission permission) throws IOException {
    if (permission.getStickyBit()) {
      super.setPermission(p, permission);
      return;
    }
    String rwx = permission.toString().substring(0, 9);
    Files.setPosixFilePermissions(pathToFile(p).toPath(), PosixFilePermissions.fromString(rwx));
  }

  @Override
  public FileStatus getFileLinkStatus(Path f) throws IOException {
    if (Files.isSymbolicLink(pathToFile(f).toPath())) {
      return super.getFileLinkStatus(f);
    }
    // What Hadoop returns for a path that is not a link, once readlink printed nothing.
    return getFileStatus(f);
  }
}
