//! Reading the files loopguard is given (policies, transcripts) with a size limit.
//!
//! Every file is read through [`read_text`]: only regular files are read (a device such as
//! `/dev/zero` never ends and a FIFO blocks until someone writes to it), and at most `limit`
//! bytes are read whatever the file claims its size is (files in `/proc` say 0).

use std::fs::{File, Metadata, OpenOptions};
use std::io::{self, Read};
use std::path::Path;

/// Reads a regular file of at most `limit` bytes as UTF-8 text. `what` names the kind of file
/// in the error for a file over the limit ("policy files", "transcripts").
///
/// Errors: `InvalidInput` for anything but a regular file, `FileTooLarge` over the limit,
/// `InvalidData` for text that is not UTF-8, and whatever opening or reading the file reports.
pub fn read_text(path: &Path, limit: usize, what: &str) -> io::Result<String> {
    // Checked before opening: opening a FIFO for reading would block until a writer appears.
    regular(&std::fs::metadata(path)?)?;
    let file = open_nonblocking(path)?;
    // Checked again on the opened file: the path may have been replaced in between.
    let meta = file.metadata()?;
    regular(&meta)?;
    let too_large = || {
        io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!("larger than the {limit}-byte limit for {what}"),
        )
    };
    if meta.len() > limit as u64 {
        return Err(too_large());
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(limit).min(limit));
    file.take(limit as u64 + 1).read_to_end(&mut bytes)?;
    if bytes.len() > limit {
        return Err(too_large());
    }
    String::from_utf8(bytes).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "not UTF-8 text (invalid byte at offset {})",
                e.utf8_error().valid_up_to()
            ),
        )
    })
}

/// Refuses anything but a regular file, naming what it is.
fn regular(meta: &Metadata) -> io::Result<()> {
    let ty = meta.file_type();
    if ty.is_file() {
        return Ok(());
    }
    let what = if ty.is_dir() {
        "a directory"
    } else {
        special_kind(&ty)
    };
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("not a regular file ({what})"),
    ))
}

#[cfg(unix)]
fn special_kind(ty: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ty.is_fifo() {
        "a FIFO"
    } else if ty.is_char_device() {
        "a character device"
    } else if ty.is_block_device() {
        "a block device"
    } else if ty.is_socket() {
        "a socket"
    } else {
        "a special file"
    }
}

#[cfg(not(unix))]
fn special_kind(_: &std::fs::FileType) -> &'static str {
    "a special file"
}

/// Opens for reading without blocking: a FIFO swapped in after the first check opens at once
/// (and is then refused) instead of waiting for a writer. Reads of regular files are unaffected.
#[cfg(unix)]
fn open_nonblocking(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
}

#[cfg(not(unix))]
fn open_nonblocking(path: &Path) -> io::Result<File> {
    OpenOptions::new().read(true).open(path)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn temp(name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("loopguard-read-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }

    #[test]
    fn a_file_at_the_limit_is_read_and_one_byte_more_is_refused() {
        let at = temp("at", &[b'a'; 64]);
        assert_eq!(read_text(&at, 64, "tests").unwrap().len(), 64);
        let over = temp("over", &[b'a'; 65]);
        let e = read_text(&over, 64, "tests").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::FileTooLarge);
        assert!(e.to_string().contains("64-byte limit for tests"), "{e}");
    }

    #[test]
    fn text_that_is_not_utf8_is_invalid_data() {
        let bad = temp("bad", b"ok\xff");
        let e = read_text(&bad, 64, "tests").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("offset 2"), "{e}");
    }

    #[cfg(unix)]
    #[test]
    fn devices_and_directories_are_refused_without_reading() {
        for path in ["/dev/zero", "/dev/urandom", "/dev/null"] {
            if Path::new(path).exists() {
                let e = read_text(Path::new(path), 1 << 20, "tests").unwrap_err();
                assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{path}");
                assert!(e.to_string().contains("character device"), "{e}");
            }
        }
        let e = read_text(&std::env::temp_dir(), 1 << 20, "tests").unwrap_err();
        assert!(e.to_string().contains("a directory"), "{e}");
    }

    /// A file in `/proc` says it is empty; it is still read only up to the limit.
    #[cfg(target_os = "linux")]
    #[test]
    fn proc_files_that_claim_size_zero_are_bounded_by_the_limit() {
        let path = Path::new("/proc/self/maps");
        if path.exists() {
            match read_text(path, 8, "tests") {
                Err(e) => assert_eq!(e.kind(), io::ErrorKind::FileTooLarge, "{e}"),
                Ok(text) => assert!(text.len() <= 8),
            }
        }
    }
}
