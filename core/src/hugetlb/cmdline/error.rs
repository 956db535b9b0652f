//! The errors of the command-line reader: what is wrong, and the byte where it starts.
#![deny(unsafe_code)]

use core::fmt;

/// A huge-page parameter was rejected; `offset` says where it starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct CmdlineError {
    /// Byte offset in the command line of the offending parameter or node entry; see
    /// [`CmdlineErrorKind`] for which.
    pub offset: usize,
    /// What is wrong with it.
    pub kind: CmdlineErrorKind,
}

/// What is wrong with a huge-page parameter.
///
/// Unless a kind says otherwise, [`CmdlineError::offset`] is the first byte of the parameter
/// (the `h` of `hugepages=`, or the `"` before it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum CmdlineErrorKind {
    /// `hugepages=`, `hugepagesz=` or `default_hugepagesz=` with nothing after the `=`.
    MissingValue,
    /// A size that is not a number with an optional `K`/`M`/`G`/`T`/`P`/`E` suffix.
    MalformedSize,
    /// A well-formed size other than 2 MiB and 1 GiB (including one beyond `u64`).
    UnsupportedSize,
    /// A `hugepagesz=` of a size an earlier `hugepagesz=` already named.
    DuplicateSize,
    /// A second `default_hugepagesz=`.
    DuplicateDefaultSize,
    /// A count that is not a decimal number. In a node list, the offset is the entry's.
    MalformedCount,
    /// A count beyond `u64`, or a node list whose counts sum beyond it. In a node list, the
    /// offset is that of the entry that overflows.
    CountOverflow,
    /// A second `hugepages=` for the same size; the offset is that of the later one.
    DuplicateCount,
    /// An empty entry in a node list, as in `0:4,,1:2`; the offset is where it starts, or for
    /// a trailing comma (`0:4,`), that comma.
    EmptyNodeEntry,
    /// A node-list entry without `:` or whose node is not a decimal number; the offset is the
    /// entry's.
    MalformedNodeEntry,
    /// A node at or above [`MAX_NODES`] (from [`parse`]), or not in the machine (from
    /// [`HugepageConfig::validate_nodes`]); the offset is the entry's.
    ///
    /// [`MAX_NODES`]: crate::topology::MAX_NODES
    /// [`parse`]: super::parse
    /// [`HugepageConfig::validate_nodes`]: super::HugepageConfig::validate_nodes
    UnknownNode,
    /// A node listed twice in one node list; the offset is that of the second entry.
    DuplicateNode,
    /// A node list of more than [`MAX_NODE_ENTRIES`](super::MAX_NODE_ENTRIES) entries; the
    /// offset is that of the first entry that does not fit.
    TooManyNodeEntries,
}

impl fmt::Display for CmdlineErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CmdlineErrorKind::MissingValue => "huge page parameter has no value",
            CmdlineErrorKind::MalformedSize => "malformed huge page size",
            CmdlineErrorKind::UnsupportedSize => "unsupported huge page size",
            CmdlineErrorKind::DuplicateSize => "hugepagesz= of this size given twice",
            CmdlineErrorKind::DuplicateDefaultSize => "default_hugepagesz= given twice",
            CmdlineErrorKind::MalformedCount => "malformed huge page count",
            CmdlineErrorKind::CountOverflow => "huge page count overflows u64",
            CmdlineErrorKind::DuplicateCount => "hugepages= given twice for one size",
            CmdlineErrorKind::EmptyNodeEntry => "empty entry in node list",
            CmdlineErrorKind::MalformedNodeEntry => "malformed node entry, expected NODE:COUNT",
            CmdlineErrorKind::UnknownNode => "unknown node",
            CmdlineErrorKind::DuplicateNode => "node given twice in one node list",
            CmdlineErrorKind::TooManyNodeEntries => "more than 64 entries in node list",
        })
    }
}

impl fmt::Display for CmdlineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "byte {}: {}", self.offset, self.kind)
    }
}

impl core::error::Error for CmdlineErrorKind {}
impl core::error::Error for CmdlineError {}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::string::{String, ToString};
    use std::vec::Vec;

    use super::*;
    use CmdlineErrorKind as K;

    #[test]
    fn display() {
        let e = CmdlineError {
            offset: 3,
            kind: K::DuplicateNode,
        };
        assert_eq!(e.to_string(), "byte 3: node given twice in one node list");
        let all = [
            K::MissingValue,
            K::MalformedSize,
            K::UnsupportedSize,
            K::DuplicateSize,
            K::DuplicateDefaultSize,
            K::MalformedCount,
            K::CountOverflow,
            K::DuplicateCount,
            K::EmptyNodeEntry,
            K::MalformedNodeEntry,
            K::UnknownNode,
            K::DuplicateNode,
            K::TooManyNodeEntries,
        ];
        let texts: Vec<String> = all.iter().map(ToString::to_string).collect();
        for (i, t) in texts.iter().enumerate() {
            assert!(!t.is_empty());
            assert!(!texts[..i].contains(t), "{t} repeated");
        }
        let _: &dyn core::error::Error = &e;
    }
}
