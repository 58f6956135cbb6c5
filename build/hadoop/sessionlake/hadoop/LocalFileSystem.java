package sessionlake.hadoop;

/**
 * The {@code file:} scheme's {@link org.apache.hadoop.fs.FileSystem} ({@code fs.file.impl}):
 * Hadoop's checksummed local file system over {@link RawLocalFileSystem}.
 */
public class LocalFileSystem extends org.apache.hadoop.fs.LocalFileSystem {

  public LocalFileSystem() {
    super(new RawLocalFileSystem());
  }
}
