//! Linux's huge-page boot parameters: `hugepagesz=`, `hugepages=` and `default_hugepagesz=`.
//!
//! [`parse`] reads a whole kernel command line and returns a [`HugepageConfig`]: the default huge
//! page size and, for each of the two sizes numaframe pools ([`HugeSize::Size2M`] and
//! [`HugeSize::Size1G`]), how many pages to reserve at boot, either spread over the nodes with
//! memory ([`PoolRequest::Balanced`]) or per node ([`PoolRequest::PerNode`]). It follows
//! `mm/hugetlb.c` and `Documentation/admin-guide/mm/hugetlbpage.rst`, with one difference: every
//! input Linux warns about and ignores is a [`CmdlineError`] naming the byte where it starts.
//! Nothing here allocates or panics, whatever the input.
//!
//! ```
//! use numaframe::hugetlb::cmdline::{PoolRequest, parse};
//! use numaframe::HugeSize;
//!
//! let cfg = parse("ro quiet hugepagesz=1G hugepages=0:4,1:2 hugepagesz=2M hugepages=512")?;
//! assert_eq!(cfg.default_size(), HugeSize::Size2M);
//! assert_eq!(cfg.total(HugeSize::Size1G), 6);
//! assert_eq!(cfg.request(HugeSize::Size2M), Some(&PoolRequest::Balanced(512)));
//! cfg.validate_nodes(2)?; // the machine has nodes 0 and 1
//! # Ok::<(), numaframe::hugetlb::cmdline::CmdlineError>(())
//! ```
//!
//! # Syntax
//!
//! The command line is split into parameters the way Linux's `next_arg` does: at ASCII whitespace
//! (space, `\t`, `\n`, `\v`, `\f`, `\r`) outside double quotes. A `"` opening the parameter or its
//! value is dropped, and so is a `"` closing it, so `"hugepages=4"` and `hugepages="0:1,1:2"`
//! work. A bare `--` ends the kernel's parameters (what follows belongs to init), so parsing stops
//! there. Names compare as in Linux's `parameqn`, with `-` and `_` alike
//! (`default-hugepagesz=1G` works). Every other parameter is ignored, including `hugepages`
//! without `=` (Linux matches `hugepages=` with its `=`).
//!
//! - `hugepagesz=SIZE` and `default_hugepagesz=SIZE`: `SIZE` is read as Linux's `memparse` reads
//!   it: a number in decimal, hexadecimal (`0x…`) or octal (leading `0`), then at most one of the
//!   suffixes `K`, `M`, `G`, `T`, `P`, `E` in either case. It must come to exactly 2 MiB (`2M`,
//!   `2048K`, `2097152`, `0x200000`) or 1 GiB (`1G`, `1024M`, `1048576K`).
//! - `hugepages=N` asks for `N` pages, spread over the nodes with memory.
//! - `hugepages=NODE:N,NODE:N,…` asks for `N` pages on each `NODE`, and none elsewhere. A value
//!   with a `:` in it is a node list. Nodes must be below [`MAX_NODES`]; that they exist is checked
//!   later with [`HugepageConfig::validate_nodes`]. At most [`MAX_NODE_ENTRIES`] entries.
//!
//! Counts and node numbers are decimal, without sign. A count must fit in a `u64`, and so must
//! the sum of a node list.
//!
//! # Which size a `hugepages=` applies to
//!
//! - After a `hugepagesz=SIZE` or a `default_hugepagesz=SIZE`: the size named by the nearer of
//!   the two before it ("hugepages … typically follows a valid hugepagesz or default_hugepagesz
//!   parameter", hugetlbpage.rst).
//! - Before either: the default size. That is the size of the `default_hugepagesz=` wherever it
//!   stands on the line, or 2 MiB without one. Linux resolves this late, in `hugetlb_init`, and so
//!   do we: `hugepages=256`, `default_hugepagesz=2M hugepages=256` and
//!   `hugepages=256 default_hugepagesz=2M` all ask for 256 pages of 2 MiB.
//!
//! Linux's code has one quirk we do not copy. In `hugepagesz=1G hugepagesz=2M
//! default_hugepagesz=1G hugepages=3`, Linux gives the 3 pages to 2 MiB, because
//! `default_hugepagesz=` only moves the parser to a size no `hugepagesz=` has named yet. We give
//! them to 1 GiB, as the documentation says.
//!
//! # Errors
//!
//! [`parse`] stops at the first error in input order. [`CmdlineErrorKind`] says, for each kind,
//! which byte [`CmdlineError::offset`] names: the first byte of the parameter (its opening quote,
//! if quoted), or for a mistake inside a node list, the first byte of the entry. An offset is
//! always below the length of the input and on a `char` boundary.
//!
//! Where Linux warns and goes on, or accepts silently, we return an error:
//!
//! | Input | Linux | Here |
//! |---|---|---|
//! | `hugepagesz=3M` | "unsupported hugepagesz", ignored | [`UnsupportedSize`] |
//! | `hugepagesz=2MB`, `hugepages=4x` | the tail is ignored silently | [`MalformedSize`], [`MalformedCount`] |
//! | a size beyond `u64` | wraps around | [`UnsupportedSize`] |
//! | `hugepagesz=2M` twice | "specified twice, ignoring" | [`DuplicateSize`] |
//! | `default_hugepagesz=` twice | "previously specified, ignoring" | [`DuplicateDefaultSize`] |
//! | a second count for one size | right after the first (`hugepages=1 hugepages=2`): the second is ignored, with a warning; after a `hugepagesz=` or `default_hugepagesz=` that names the size the first count went to (`hugepages=2 default_hugepagesz=2M hugepages=1`, one page of 2 MiB): the later one replaces it silently | [`DuplicateCount`] |
//! | `hugepages=` | "Invalid hugepages parameter" | [`MissingValue`] |
//! | `0:4,,1:2`, `9999:1`, `x:1` | "Invalid hugepages parameter", ignored | [`EmptyNodeEntry`], [`UnknownNode`], [`MalformedNodeEntry`] |
//! | a trailing comma, `0:4,` | accepted silently | [`EmptyNodeEntry`] |
//! | `0:1,0:2` | the node gets 2, the total 3 | [`DuplicateNode`] |
//!
//! One thing Linux refuses is accepted here: `default_hugepagesz=1G hugepages=2 hugepagesz=1G` is
//! "hugepagesz specified twice" in Linux (the default size was named and counted already), but
//! only a repeated `hugepagesz=` is a [`DuplicateSize`] here. A count after it would still be a
//! [`DuplicateCount`].
//!
//! [`MAX_NODES`]: crate::topology::MAX_NODES
//! [`HugeSize::Size2M`]: crate::addr::HugeSize::Size2M
//! [`HugeSize::Size1G`]: crate::addr::HugeSize::Size1G
//! [`UnsupportedSize`]: CmdlineErrorKind::UnsupportedSize
//! [`MalformedSize`]: CmdlineErrorKind::MalformedSize
//! [`MalformedCount`]: CmdlineErrorKind::MalformedCount
//! [`DuplicateSize`]: CmdlineErrorKind::DuplicateSize
//! [`DuplicateDefaultSize`]: CmdlineErrorKind::DuplicateDefaultSize
//! [`DuplicateCount`]: CmdlineErrorKind::DuplicateCount
//! [`MissingValue`]: CmdlineErrorKind::MissingValue
//! [`EmptyNodeEntry`]: CmdlineErrorKind::EmptyNodeEntry
//! [`UnknownNode`]: CmdlineErrorKind::UnknownNode
//! [`MalformedNodeEntry`]: CmdlineErrorKind::MalformedNodeEntry
//! [`DuplicateNode`]: CmdlineErrorKind::DuplicateNode
#![deny(unsafe_code)]

mod config;
mod error;
mod format;
mod number;
mod params;
mod parse;

pub use self::config::{HugepageConfig, MAX_NODE_ENTRIES, NodeCount, PoolRequest};
pub use self::error::{CmdlineError, CmdlineErrorKind};
pub use self::format::{FormattedSize, format_size};
pub use self::parse::parse;

#[cfg(test)]
mod test_support {
    //! Shorthands for the tests of the reader's parts, which all go through [`parse`].
    extern crate std;
    use std::vec::Vec;

    use super::*;
    use crate::addr::HugeSize;

    pub(super) fn ok(cmdline: &str) -> HugepageConfig {
        match parse(cmdline) {
            Ok(cfg) => cfg,
            Err(e) => panic!("{cmdline:?}: {e}"),
        }
    }

    #[track_caller]
    pub(super) fn err(cmdline: &str, offset: usize, kind: CmdlineErrorKind) {
        assert_eq!(
            parse(cmdline),
            Err(CmdlineError { offset, kind }),
            "{cmdline:?}"
        );
    }

    pub(super) fn balanced(cfg: &HugepageConfig, size: HugeSize) -> Option<u64> {
        match cfg.request(size) {
            Some(PoolRequest::Balanced(n)) => Some(*n),
            _ => None,
        }
    }

    /// `(node, count, offset)` of a node list.
    pub(super) fn per_node(cfg: &HugepageConfig, size: HugeSize) -> Vec<(usize, u64, usize)> {
        match cfg.request(size) {
            Some(PoolRequest::PerNode(v)) => v
                .iter()
                .map(|e| (e.node.index(), e.count, e.offset))
                .collect(),
            other => panic!("not a node list: {other:?}"),
        }
    }
}
