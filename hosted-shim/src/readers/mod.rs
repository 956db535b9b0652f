//! Topology readers: each turns one outside description of a machine into a [`MachineSpec`].
//!
//! | source | text | file / directory |
//! |---|---|---|
//! | the TOML schema of docs/ ("Hosted CLI contract") | [`parse_toml`] | [`read_toml_file`] |
//! | what `numactl --hardware` prints | [`parse_numactl`] | [`read_numactl_file`] |
//! | Linux sysfs (`/sys/devices/system/node`) | | [`read_sysfs`] |
//!
//! numaframe needs node ids `0..n`. Every reader rejects sparse ids (`0,2`) with an error that
//! says so rather than renumbering them silently, because a renumbered machine would print
//! fallback orders that do not match the node numbers the user sees elsewhere.
//!
//! No input makes a reader panic, and every reader bounds the memory it uses by the size of its
//! input: files above [`MAX_INPUT_BYTES`] are refused.
//!
//! [`MachineSpec`]: crate::spec::MachineSpec
#![deny(unsafe_code)]

use std::io::Read;
use std::path::Path;

use crate::spec::SpecError;

mod numactl;
mod sysfs;
mod toml;

pub use self::numactl::{parse_numactl, read_numactl_file};
pub use self::sysfs::{DEFAULT_SYSFS_DIR, read_sysfs};
pub use self::toml::{parse_toml, read_toml_file};

/// The largest file a reader accepts (16 MiB; a 1024-node TOML file needs about 4 MiB).
pub const MAX_INPUT_BYTES: u64 = 16 << 20;

/// Reads a UTF-8 text file of at most [`MAX_INPUT_BYTES`], turning every failure into a
/// [`SpecError`] naming `path`. Reading stops at the limit, so `/dev/zero` is refused, not
/// slurped.
pub(crate) fn read_text(path: &Path) -> Result<String, SpecError> {
    let file = std::fs::File::open(path).map_err(|e| SpecError::io(path, &e))?;
    let mut bytes = Vec::new();
    file.take(MAX_INPUT_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| SpecError::io(path, &e))?;
    if bytes.len() as u64 > MAX_INPUT_BYTES {
        return Err(SpecError::syntax(format!(
            "file is larger than {} MiB",
            MAX_INPUT_BYTES >> 20
        ))
        .in_file(path.display().to_string()));
    }
    String::from_utf8(bytes).map_err(|e| {
        SpecError::syntax(format!(
            "not UTF-8 text (byte {})",
            e.utf8_error().valid_up_to()
        ))
        .in_file(path.display().to_string())
    })
}

/// The 1-based line holding byte `offset` of `text` (the last line if `offset` is past the end).
pub(crate) fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// A file's stem as a machine name (`machines/big.toml` → `big`), or `fallback`.
pub(crate) fn name_from_path(path: &Path, fallback: &str) -> String {
    path.file_stem()
        .and_then(|s| s.to_str())
        .filter(|s| !s.is_empty())
        .unwrap_or(fallback)
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines() {
        assert_eq!(line_of("a\nb\nc", 0), 1);
        assert_eq!(line_of("a\nb\nc", 2), 2);
        assert_eq!(line_of("a\nb\nc", 99), 3);
    }

    #[test]
    fn read_text_errors() {
        let e = read_text(Path::new("/nonexistent/numaframe.toml")).unwrap_err();
        assert!(
            e.to_string().starts_with("/nonexistent/numaframe.toml: "),
            "{e}"
        );
        if Path::new("/dev/zero").exists() {
            let e = read_text(Path::new("/dev/zero")).unwrap_err();
            assert!(e.to_string().contains("larger than"), "{e}");
        }
        assert!(read_text(Path::new("/")).is_err());
    }

    #[test]
    fn names() {
        assert_eq!(name_from_path(Path::new("a/big.toml"), "toml"), "big");
        assert_eq!(name_from_path(Path::new("/"), "toml"), "toml");
    }
}
