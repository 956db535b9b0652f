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
//! | a second count for one size | the first one is kept, with a warning | [`DuplicateCount`] |
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

use core::fmt;

use crate::addr::HugeSize;
use crate::topology::NodeId;

/// The most entries a node list (`hugepages=0:4,1:2,…`) may hold.
pub const MAX_NODE_ENTRIES: usize = 64;

/// Shows a huge page size the way Linux's `string_get_size(size, 1, STRING_UNITS_2, …)` does:
/// `2.00 MiB`, `1.00 GiB`, as in `HugeTLB: registered 1.00 GiB page size, pre-allocated 8 pages`.
#[must_use]
pub fn format_size(size: HugeSize) -> FormattedSize {
    FormattedSize(size)
}

/// A huge page size shown as Linux shows it; made by [`format_size`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FormattedSize(HugeSize);

impl fmt::Display for FormattedSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.0 {
            HugeSize::Size2M => "2.00 MiB",
            HugeSize::Size1G => "1.00 GiB",
        })
    }
}

/// One entry of a node list: `count` pages on `node`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct NodeCount {
    /// The node.
    pub node: NodeId,
    /// Pages to reserve on it.
    pub count: u64,
    /// Byte offset of the entry (`1:2` in `hugepages=0:4,1:2`) in the command line, for errors
    /// found later, as by [`HugepageConfig::validate_nodes`].
    pub offset: usize,
}

/// How many pages of one size to reserve at boot.
///
/// A node list is stored inline (about 1.5 KiB), so [`PoolRequest::Balanced`] takes as much room;
/// a config holds two of these, once, at boot.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[allow(
    clippy::large_enum_variant,
    reason = "no heap to box the node list in; one config is built once at boot"
)]
pub enum PoolRequest {
    /// `hugepages=N`: `N` pages, spread round-robin by the caller over the nodes with memory.
    Balanced(u64),
    /// `hugepages=NODE:N,…`: the given count on each listed node and none on the others.
    ///
    /// From [`parse`], the nodes are distinct and the counts sum to at most `u64::MAX`.
    PerNode(heapless::Vec<NodeCount, MAX_NODE_ENTRIES>),
}

impl PoolRequest {
    /// The number of pages asked for over all nodes (saturating at `u64::MAX`, which a request
    /// from [`parse`] never reaches).
    pub fn total(&self) -> u64 {
        match self {
            PoolRequest::Balanced(n) => *n,
            PoolRequest::PerNode(entries) => entries
                .iter()
                .fold(0u64, |sum, e| sum.saturating_add(e.count)),
        }
    }
}

/// One value for each [`HugeSize`], without indexing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct PerSize<T> {
    size_2m: T,
    size_1g: T,
}

impl<T> PerSize<T> {
    fn get(&self, size: HugeSize) -> &T {
        match size {
            HugeSize::Size2M => &self.size_2m,
            HugeSize::Size1G => &self.size_1g,
        }
    }
    fn get_mut(&mut self, size: HugeSize) -> &mut T {
        match size {
            HugeSize::Size2M => &mut self.size_2m,
            HugeSize::Size1G => &mut self.size_1g,
        }
    }
}

/// The huge-page pools a command line asks for; made by [`parse`].
///
/// [`Default`] is what an empty command line gives: default size 2 MiB, no pages.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HugepageConfig {
    default_size: HugeSize,
    requests: PerSize<Option<PoolRequest>>,
}

impl Default for HugepageConfig {
    fn default() -> Self {
        Self {
            default_size: HugeSize::Size2M,
            requests: PerSize::default(),
        }
    }
}

impl HugepageConfig {
    /// The default huge page size: the one `default_hugepagesz=` names, or 2 MiB.
    pub fn default_size(&self) -> HugeSize {
        self.default_size
    }
    /// What the command line asks for `size`, or `None` if no `hugepages=` applies to it.
    pub fn request(&self, size: HugeSize) -> Option<&PoolRequest> {
        self.requests.get(size).as_ref()
    }
    /// The number of pages of `size` asked for; 0 without a request.
    pub fn total(&self, size: HugeSize) -> u64 {
        self.request(size).map_or(0, PoolRequest::total)
    }
    /// Checks that every node named in a node list is below `node_count`, the number of nodes
    /// of the machine (Linux checks `node_online` at this point).
    ///
    /// # Errors
    /// [`CmdlineErrorKind::UnknownNode`] at the entry of the first such node in input order.
    pub fn validate_nodes(&self, node_count: usize) -> Result<(), CmdlineError> {
        let first_unknown = HugeSize::ALL
            .iter()
            .filter_map(|&size| match self.request(size) {
                Some(PoolRequest::PerNode(entries)) => Some(entries),
                _ => None,
            })
            .flat_map(|entries| entries.iter())
            .filter(|e| e.node.index() >= node_count)
            .map(|e| e.offset)
            .min();
        match first_unknown {
            Some(offset) => Err(CmdlineError {
                offset,
                kind: CmdlineErrorKind::UnknownNode,
            }),
            None => Ok(()),
        }
    }
}

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
    /// A node at or above [`MAX_NODES`](crate::topology::MAX_NODES) (from [`parse`]), or not in
    /// the machine (from [`HugepageConfig::validate_nodes`]); the offset is the entry's.
    UnknownNode,
    /// A node listed twice in one node list; the offset is that of the second entry.
    DuplicateNode,
    /// A node list of more than [`MAX_NODE_ENTRIES`] entries; the offset is that of the first
    /// entry that does not fit.
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

/// Parses the huge-page parameters of a kernel command line; see the [module docs](self) for
/// the syntax and for which size each `hugepages=` applies to.
///
/// # Errors
/// The first rejected parameter in input order, as a [`CmdlineError`].
pub fn parse(cmdline: &str) -> Result<HugepageConfig, CmdlineError> {
    let input = cmdline.as_bytes();
    // Linux decides the default size in `hugetlb_init`, after the whole line. Finding it first
    // lets a `hugepages=` before `default_hugepagesz=` be checked against the right size as it
    // is read, so errors come out in input order. If the first `default_hugepagesz=` is bad, the
    // loop below fails on it; until then 2 MiB stands in, which is Linux's fallback too.
    let default_size = Params::new(input)
        .find_map(|p| match p.name() {
            Some(Name::DefaultHugepagesz) => Some(p.value),
            _ => None,
        })
        .and_then(|value| parse_size(value).ok())
        .and_then(HugeSize::from_bytes)
        .unwrap_or(HugeSize::Size2M);

    let mut config = HugepageConfig {
        default_size,
        requests: PerSize::default(),
    };
    let mut size_named = PerSize::<bool>::default();
    let mut default_named = false;
    // The size the next `hugepages=` applies to.
    let mut target = default_size;

    for param in Params::new(input) {
        let Some(name) = param.name() else { continue };
        let fail = |kind| CmdlineError {
            offset: param.offset,
            kind,
        };
        if param.value.is_empty() {
            return Err(fail(CmdlineErrorKind::MissingValue));
        }
        match name {
            Name::Hugepagesz => {
                let size = size_value(param.value).map_err(fail)?;
                if core::mem::replace(size_named.get_mut(size), true) {
                    return Err(fail(CmdlineErrorKind::DuplicateSize));
                }
                target = size;
            }
            Name::DefaultHugepagesz => {
                let size = size_value(param.value).map_err(fail)?;
                if core::mem::replace(&mut default_named, true) {
                    return Err(fail(CmdlineErrorKind::DuplicateDefaultSize));
                }
                // The first `default_hugepagesz=` parsed cleanly, so it is the one the
                // look-ahead above found: `size == default_size`.
                target = size;
            }
            Name::Hugepages => {
                let request = parse_request(param.value, param.value_offset, param.offset)?;
                let slot = config.requests.get_mut(target);
                if slot.is_some() {
                    return Err(fail(CmdlineErrorKind::DuplicateCount));
                }
                *slot = Some(request);
            }
        }
    }
    Ok(config)
}

/// The parameters this module handles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Name {
    Hugepagesz,
    Hugepages,
    DefaultHugepagesz,
}

/// One `name=value` parameter of the command line (parameters without `=` are skipped).
#[derive(Clone, Copy, Debug)]
struct Param<'a> {
    /// First byte of the parameter, its opening quote included.
    offset: usize,
    name: &'a [u8],
    /// The value, quotes removed.
    value: &'a [u8],
    /// First byte of `value`.
    value_offset: usize,
}

impl Param<'_> {
    /// Which of our parameters this is, comparing `-` and `_` alike as Linux's `parameqn` does.
    fn name(&self) -> Option<Name> {
        const NAMES: [(&[u8], Name); 3] = [
            (b"hugepagesz", Name::Hugepagesz),
            (b"hugepages", Name::Hugepages),
            (b"default_hugepagesz", Name::DefaultHugepagesz),
        ];
        let fold = |b: u8| if b == b'-' { b'_' } else { b };
        NAMES
            .iter()
            .find(|(want, _)| {
                want.len() == self.name.len()
                    && want.iter().zip(self.name).all(|(&w, &n)| w == fold(n))
            })
            .map(|&(_, name)| name)
    }
}

/// Linux's `isspace` on ASCII. (Linux also counts the Latin-1 byte 0xA0; in UTF-8 that byte is
/// part of a longer character, so splitting there would cut the character.)
const fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// `bytes[from..to]`, or nothing if out of range (never, for the ranges used here).
fn slice(bytes: &[u8], from: usize, to: usize) -> &[u8] {
    bytes.get(from..to).unwrap_or_default()
}

/// The `name=value` parameters of a command line, split as Linux's `next_arg` splits them, up to
/// a bare `--`.
#[derive(Clone, Debug)]
struct Params<'a> {
    input: &'a [u8],
    pos: usize,
}

impl<'a> Params<'a> {
    fn new(input: &'a [u8]) -> Self {
        Self { input, pos: 0 }
    }
}

impl<'a> Iterator for Params<'a> {
    type Item = Param<'a>;

    fn next(&mut self) -> Option<Param<'a>> {
        let input = self.input;
        loop {
            while input.get(self.pos).copied().is_some_and(is_space) {
                self.pos += 1;
            }
            let offset = self.pos;
            let &first = input.get(offset)?;
            let quoted = first == b'"';
            let start = if quoted { offset + 1 } else { offset };
            let mut end = start;
            let mut in_quote = quoted;
            let mut equals = None;
            while let Some(&b) = input.get(end) {
                if is_space(b) && !in_quote {
                    break;
                }
                if b == b'=' && equals.is_none() {
                    equals = Some(end);
                }
                if b == b'"' {
                    in_quote = !in_quote;
                }
                end += 1;
            }
            // `end` is at a space or the end of the input; the next call skips it.
            self.pos = end;
            // Linux drops one closing quote, the last byte, if the parameter or its value
            // opened with one.
            let unquote_end = |from: usize| {
                if end > from && input.get(end - 1) == Some(&b'"') {
                    end - 1
                } else {
                    end
                }
            };
            let Some(eq) = equals else {
                let name_end = if quoted { unquote_end(start) } else { end };
                if slice(input, start, name_end) == b"--" {
                    self.pos = input.len();
                    return None;
                }
                continue;
            };
            let mut value_offset = eq + 1;
            let value_quoted = value_offset < end && input.get(value_offset) == Some(&b'"');
            if value_quoted {
                value_offset += 1;
            }
            let value_end = if quoted || value_quoted {
                unquote_end(value_offset)
            } else {
                end
            };
            return Some(Param {
                offset,
                name: slice(input, start, eq),
                value: slice(input, value_offset, value_end),
                value_offset,
            });
        }
    }
}

/// Why a number was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NumError {
    /// Not of the expected form.
    Malformed,
    /// Of the expected form but beyond `u64`.
    Overflow,
}

/// Digits in `radix` (8, 10 or 16), at least one.
fn parse_digits(digits: &[u8], radix: u32) -> Result<u64, NumError> {
    if digits.is_empty() || !digits.iter().all(|&d| char::from(d).is_digit(radix)) {
        return Err(NumError::Malformed);
    }
    digits
        .iter()
        .try_fold(0u64, |acc, &d| {
            acc.checked_mul(u64::from(radix))?
                .checked_add(u64::from(char::from(d).to_digit(radix)?))
        })
        .ok_or(NumError::Overflow)
}

/// A size as Linux's `memparse` reads it, but requiring the whole value to be used.
fn parse_size(value: &[u8]) -> Result<u64, NumError> {
    // `simple_strtoull(…, 0)`: `0x` followed by a hex digit is hex, a leading 0 is octal.
    let (radix, body) = match value {
        [b'0', b'x' | b'X', h, ..] if h.is_ascii_hexdigit() => (16, slice(value, 2, value.len())),
        [b'0', ..] => (8, value),
        _ => (10, value),
    };
    let digit_count = body
        .iter()
        .take_while(|&&b| char::from(b).is_digit(radix))
        .count();
    let (digits, suffix) = body.split_at_checked(digit_count).unwrap_or((body, &[]));
    let shift = match suffix {
        [] => 0,
        [b'k' | b'K'] => 10,
        [b'm' | b'M'] => 20,
        [b'g' | b'G'] => 30,
        [b't' | b'T'] => 40,
        [b'p' | b'P'] => 50,
        [b'e' | b'E'] => 60,
        _ => return Err(NumError::Malformed),
    };
    parse_digits(digits, radix)?
        .checked_mul(1u64 << shift)
        .ok_or(NumError::Overflow)
}

/// The value of `hugepagesz=` or `default_hugepagesz=`.
fn size_value(value: &[u8]) -> Result<HugeSize, CmdlineErrorKind> {
    match parse_size(value) {
        Ok(bytes) => HugeSize::from_bytes(bytes).ok_or(CmdlineErrorKind::UnsupportedSize),
        Err(NumError::Malformed) => Err(CmdlineErrorKind::MalformedSize),
        Err(NumError::Overflow) => Err(CmdlineErrorKind::UnsupportedSize),
    }
}

/// The value of `hugepages=`, which starts at `value_offset`; `param_offset` is where the
/// parameter starts.
fn parse_request(
    value: &[u8],
    value_offset: usize,
    param_offset: usize,
) -> Result<PoolRequest, CmdlineError> {
    if !value.contains(&b':') {
        return match parse_digits(value, 10) {
            Ok(n) => Ok(PoolRequest::Balanced(n)),
            Err(e) => Err(CmdlineError {
                offset: param_offset,
                kind: match e {
                    NumError::Malformed => CmdlineErrorKind::MalformedCount,
                    NumError::Overflow => CmdlineErrorKind::CountOverflow,
                },
            }),
        };
    }

    let mut entries = heapless::Vec::<NodeCount, MAX_NODE_ENTRIES>::new();
    let mut sum = 0u64;
    let mut entry_offset = value_offset;
    let mut pieces = value.split(|&b| b == b',').peekable();
    while let Some(entry) = pieces.next() {
        let at = entry_offset;
        let fail = move |kind| Err(CmdlineError { offset: at, kind });
        if entry.is_empty() {
            // A trailing empty entry starts at the end of the value: name its comma instead,
            // so the offset stays inside the input. (There is one: the value is not empty.)
            let offset = if pieces.peek().is_some() {
                at
            } else {
                at.saturating_sub(1)
            };
            return Err(CmdlineError {
                offset,
                kind: CmdlineErrorKind::EmptyNodeEntry,
            });
        }
        let Some(colon) = entry.iter().position(|&b| b == b':') else {
            return fail(CmdlineErrorKind::MalformedNodeEntry);
        };
        let node = parse_digits(slice(entry, 0, colon), 10);
        let count = parse_digits(slice(entry, colon + 1, entry.len()), 10);
        // Form first, then range, so `x:1` and `1:x` say what is malformed.
        let node = match node {
            Err(NumError::Malformed) => return fail(CmdlineErrorKind::MalformedNodeEntry),
            Err(NumError::Overflow) => None,
            Ok(n) => usize::try_from(n).ok().and_then(NodeId::try_new),
        };
        let count = match count {
            Err(NumError::Malformed) => return fail(CmdlineErrorKind::MalformedCount),
            Err(NumError::Overflow) => None,
            Ok(c) => Some(c),
        };
        let Some(node) = node else {
            return fail(CmdlineErrorKind::UnknownNode);
        };
        let Some(count) = count else {
            return fail(CmdlineErrorKind::CountOverflow);
        };
        if entries.iter().any(|e| e.node == node) {
            return fail(CmdlineErrorKind::DuplicateNode);
        }
        let Some(new_sum) = sum.checked_add(count) else {
            return fail(CmdlineErrorKind::CountOverflow);
        };
        sum = new_sum;
        let new_entry = NodeCount {
            node,
            count,
            offset: entry_offset,
        };
        if entries.push(new_entry).is_err() {
            return fail(CmdlineErrorKind::TooManyNodeEntries);
        }
        // Offsets stay within the input's length plus one, far from `usize::MAX`.
        entry_offset += entry.len() + 1;
    }
    Ok(PoolRequest::PerNode(entries))
}

#[cfg(test)]
mod tests {
    extern crate std;

    use std::format;
    use std::string::{String, ToString};
    use std::vec::Vec;

    use super::*;
    use crate::topology::MAX_NODES;

    use CmdlineErrorKind as K;
    use HugeSize::{Size1G, Size2M};

    fn ok(cmdline: &str) -> HugepageConfig {
        match parse(cmdline) {
            Ok(cfg) => cfg,
            Err(e) => panic!("{cmdline:?}: {e}"),
        }
    }

    #[track_caller]
    fn err(cmdline: &str, offset: usize, kind: CmdlineErrorKind) {
        assert_eq!(
            parse(cmdline),
            Err(CmdlineError { offset, kind }),
            "{cmdline:?}"
        );
    }

    fn balanced(cfg: &HugepageConfig, size: HugeSize) -> Option<u64> {
        match cfg.request(size) {
            Some(PoolRequest::Balanced(n)) => Some(*n),
            _ => None,
        }
    }

    /// `(node, count, offset)` of a node list.
    fn per_node(cfg: &HugepageConfig, size: HugeSize) -> Vec<(usize, u64, usize)> {
        match cfg.request(size) {
            Some(PoolRequest::PerNode(v)) => v
                .iter()
                .map(|e| (e.node.index(), e.count, e.offset))
                .collect(),
            other => panic!("not a node list: {other:?}"),
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(format_size(Size2M).to_string(), "2.00 MiB");
        assert_eq!(format_size(Size1G).to_string(), "1.00 GiB");
        assert_eq!(
            format!(
                "HugeTLB: registered {} page size, pre-allocated {} pages",
                format_size(Size1G),
                8
            ),
            "HugeTLB: registered 1.00 GiB page size, pre-allocated 8 pages"
        );
    }

    #[test]
    fn size_spellings() {
        let two_m = [
            "2M",
            "2m",
            "2048K",
            "2048k",
            "2097152",
            "0x200000",
            "0X200000",
            "010000000",
            "0x800K",
        ];
        let one_g = [
            "1G",
            "1g",
            "1024M",
            "1024m",
            "1048576K",
            "1048576k",
            "1073741824",
            "0x40000000",
            "0x1G",
            "01G",
        ];
        for (spellings, size) in [(&two_m[..], Size2M), (&one_g[..], Size1G)] {
            for s in spellings {
                let cfg = ok(&format!("hugepagesz={s} hugepages=3"));
                assert_eq!(balanced(&cfg, size), Some(3), "{s}");
                assert_eq!(ok(&format!("default_hugepagesz={s}")).default_size(), size);
            }
        }
    }

    #[test]
    fn empty_and_unrelated() {
        for s in [
            "",
            "   ",
            "\t\n",
            "console=ttyS0 quiet",
            "BOOT_IMAGE=/vmlinuz-6.8 root=UUID=1234 ro transparent_hugepage=never",
            "hugepages hugepagesz default_hugepagesz",
            "hugepageszz=3M xhugepages=4 hugepages_node=1 nohugepages=1 hugepagesz2=1G",
            "hugetlb_free_vmemmap=on hugetlb_cma=4G =hugepages=4",
        ] {
            assert_eq!(parse(s), Ok(HugepageConfig::default()), "{s:?}");
        }
        let cfg = HugepageConfig::default();
        assert_eq!(cfg.default_size(), Size2M);
        assert_eq!(cfg.request(Size2M), None);
        assert_eq!(cfg.total(Size1G), 0);
    }

    #[test]
    fn plain_counts() {
        let cfg = ok("hugepages=16");
        assert_eq!(cfg.default_size(), Size2M);
        assert_eq!(balanced(&cfg, Size2M), Some(16));
        assert_eq!(cfg.request(Size1G), None);

        let cfg = ok("console=ttyS0 hugepagesz=1G hugepages=8 quiet hugepagesz=2M hugepages=512");
        assert_eq!(balanced(&cfg, Size1G), Some(8));
        assert_eq!(balanced(&cfg, Size2M), Some(512));
        assert_eq!(cfg.total(Size1G), 8);
        assert_eq!(cfg.total(Size2M), 512);

        assert_eq!(balanced(&ok("hugepages=0"), Size2M), Some(0));
        assert_eq!(balanced(&ok("hugepages=007"), Size2M), Some(7));
        let max = ok("hugepages=18446744073709551615");
        assert_eq!(max.total(Size2M), u64::MAX);
        // A size named without a count registers nothing here.
        assert_eq!(ok("hugepagesz=1G"), HugepageConfig::default());
        assert_eq!(
            balanced(&ok("hugepagesz=2M hugepagesz=1G hugepages=3"), Size1G),
            Some(3)
        );
    }

    #[test]
    fn default_size_positions() {
        // hugetlbpage.rst: on x86 these all ask for 256 pages of 2 MiB.
        for s in [
            "hugepages=256",
            "default_hugepagesz=2M hugepages=256",
            "hugepages=256 default_hugepagesz=2M",
        ] {
            let cfg = ok(s);
            assert_eq!(cfg.default_size(), Size2M);
            assert_eq!(balanced(&cfg, Size2M), Some(256), "{s}");
            assert_eq!(cfg.request(Size1G), None, "{s}");
        }
        // A count before any size goes to the default size, wherever the default is named.
        for s in [
            "default_hugepagesz=1G hugepages=4",
            "hugepages=4 default_hugepagesz=1G",
            "hugepages=4 hugepagesz=2M hugepages=9 default_hugepagesz=1G",
            "default-hugepagesz=1G hugepages=4",
        ] {
            let cfg = ok(s);
            assert_eq!(cfg.default_size(), Size1G, "{s}");
            assert_eq!(balanced(&cfg, Size1G), Some(4), "{s}");
        }
        // `default_hugepagesz=` moves the parser to its size, as `hugepagesz=` does.
        let cfg = ok("hugepagesz=2M hugepages=1 default_hugepagesz=1G hugepages=4");
        assert_eq!(balanced(&cfg, Size2M), Some(1));
        assert_eq!(balanced(&cfg, Size1G), Some(4));
        // ... even for a size `hugepagesz=` named already (Linux would pick 2M here).
        let cfg = ok("hugepagesz=1G hugepagesz=2M default_hugepagesz=1G hugepages=3");
        assert_eq!(balanced(&cfg, Size1G), Some(3));
        // `hugepagesz=` may repeat the default size, as in Linux.
        let cfg = ok("default_hugepagesz=1G hugepagesz=1G hugepages=3");
        assert_eq!(balanced(&cfg, Size1G), Some(3));
        let cfg = ok("hugepagesz=1G hugepages=2 default_hugepagesz=1G");
        assert_eq!(cfg.default_size(), Size1G);
        assert_eq!(balanced(&cfg, Size1G), Some(2));
    }

    #[test]
    fn node_lists() {
        let s = "hugepagesz=2M hugepages=0:1,1:2";
        let cfg = ok(s);
        assert_eq!(per_node(&cfg, Size2M), [(0, 1, 24), (1, 2, 28)]);
        assert_eq!(cfg.total(Size2M), 3);
        assert_eq!(&s[24..27], "0:1");
        assert_eq!(&s[28..], "1:2");

        let cfg = ok("hugepages=3:0 default_hugepagesz=1G");
        assert_eq!(per_node(&cfg, Size1G), [(3, 0, 10)]);
        assert_eq!(cfg.total(Size1G), 0);

        let cfg = ok("hugepagesz=1G hugepages=1023:1,0:0");
        assert_eq!(per_node(&cfg, Size1G), [(1023, 1, 24), (0, 0, 31)]);

        let max = u64::MAX - 1;
        let cfg = ok(&format!("hugepages=0:{max},7:1"));
        assert_eq!(cfg.total(Size2M), u64::MAX);

        let list: Vec<String> = (0..MAX_NODE_ENTRIES).map(|n| format!("{n}:1")).collect();
        let cfg = ok(&format!("hugepages={}", list.join(",")));
        assert_eq!(cfg.total(Size2M), MAX_NODE_ENTRIES as u64);

        let cfg = ok("hugepagesz=1G hugepages=0:4,1:2 hugepagesz=2M hugepages=1:5");
        assert_eq!(cfg.validate_nodes(2), Ok(()));
        assert_eq!(cfg.validate_nodes(MAX_NODES), Ok(()));
        // Node 1 of 1G (byte 28) comes before node 1 of 2M (byte 56).
        assert_eq!(
            cfg.validate_nodes(1),
            Err(CmdlineError {
                offset: 28,
                kind: K::UnknownNode
            })
        );
        let cfg = ok("hugepagesz=2M hugepages=1:5 hugepagesz=1G hugepages=0:4,3:2");
        assert_eq!(
            cfg.validate_nodes(2),
            Err(CmdlineError {
                offset: 56,
                kind: K::UnknownNode
            })
        );
        assert_eq!(ok("hugepages=9").validate_nodes(0), Ok(()));
    }

    #[test]
    fn quotes_and_separators() {
        assert_eq!(balanced(&ok("\"hugepages=4\""), Size2M), Some(4));
        assert_eq!(balanced(&ok("hugepages=\"4\""), Size2M), Some(4));
        assert_eq!(
            per_node(&ok("hugepages=\"0:1,1:2\""), Size2M),
            [(0, 1, 11), (1, 2, 15)]
        );
        // Spaces inside quotes do not split, so this is one unrelated parameter.
        assert_eq!(
            ok("dyndbg=\"file x hugepages=q +p\""),
            HugepageConfig::default()
        );
        let cfg = ok("\thugepagesz=1G\n\nhugepages=2\x0b\x0c\rhugepagesz=2M  hugepages=1 ");
        assert_eq!(cfg.total(Size1G), 2);
        assert_eq!(cfg.total(Size2M), 1);
        // Parameters after `--` belong to init.
        assert_eq!(balanced(&ok("hugepages=4 -- hugepages=x"), Size2M), Some(4));
        assert_eq!(
            balanced(&ok("hugepages=4 \"--\" hugepages=x"), Size2M),
            Some(4)
        );
        assert_eq!(ok("-- default_hugepagesz=1G").default_size(), Size2M);
        // `--x` and `--=` are ordinary (ignored) parameters.
        assert_eq!(balanced(&ok("--x --= hugepages=5"), Size2M), Some(5));
        // Non-ASCII text around is fine.
        assert_eq!(
            balanced(&ok("café=été\u{a0} hugepages=5 ü"), Size2M),
            Some(5)
        );
    }

    #[test]
    fn size_errors() {
        err("console=ttyS0 hugepagesz=3M", 14, K::UnsupportedSize);
        let e = parse("console=ttyS0 hugepagesz=3M").unwrap_err();
        assert_eq!(e.to_string(), "byte 14: unsupported huge page size");
        err("hugepagesz=4K", 0, K::UnsupportedSize);
        err("hugepagesz=0", 0, K::UnsupportedSize);
        err("hugepagesz=1T", 0, K::UnsupportedSize);
        err("hugepagesz=16E", 0, K::UnsupportedSize);
        err("hugepagesz=18446744073709551616", 0, K::UnsupportedSize);
        err("hugepagesz=0x1ffffffffffffffffG", 0, K::UnsupportedSize);
        err(" default_hugepagesz=4M", 1, K::UnsupportedSize);
        err("hugepagesz=2MB", 0, K::MalformedSize);
        err("hugepagesz=M", 0, K::MalformedSize);
        err("hugepagesz=2 M", 0, K::UnsupportedSize);
        err("hugepagesz=0x", 0, K::MalformedSize);
        err("hugepagesz=09M", 0, K::MalformedSize);
        err("hugepagesz=-2M", 0, K::MalformedSize);
        err("hugepagesz=+2M", 0, K::MalformedSize);
        err("hugepagesz=2.0M", 0, K::MalformedSize);
        err("a hugepagesz=\"2Mx\"", 2, K::MalformedSize);
        err("ro default_hugepagesz=big", 3, K::MalformedSize);
        err("ro hugepagesz=1G hugepagesz=1G", 17, K::DuplicateSize);
        err(
            "hugepagesz=2M hugepages=1 hugepagesz=2048K",
            26,
            K::DuplicateSize,
        );
        err(
            "default_hugepagesz=1G default_hugepagesz=1G",
            22,
            K::DuplicateDefaultSize,
        );
        err(
            "default_hugepagesz=2M x default-hugepagesz=1G",
            24,
            K::DuplicateDefaultSize,
        );
    }

    #[test]
    fn count_errors() {
        err("hugepages=", 0, K::MissingValue);
        err("quiet hugepages=\"\"", 6, K::MissingValue);
        err("hugepagesz=", 0, K::MissingValue);
        err("x default_hugepagesz=", 2, K::MissingValue);
        err("hugepages=x", 0, K::MalformedCount);
        err("hugepages=4x", 0, K::MalformedCount);
        err("hugepages=4,5", 0, K::MalformedCount);
        err("hugepages=-1", 0, K::MalformedCount);
        err("hugepages=+1", 0, K::MalformedCount);
        err("hugepages=0x10", 0, K::MalformedCount);
        err(
            "hugepagesz=1G hugepages=18446744073709551616",
            14,
            K::CountOverflow,
        );
        // A second count for one size, however it comes about: the later one is named.
        err("hugepages=1 hugepages=2", 12, K::DuplicateCount);
        err(
            "hugepagesz=2M hugepages=1 hugepages=0:1",
            26,
            K::DuplicateCount,
        );
        err(
            "hugepages=256 hugepagesz=2M hugepages=512",
            28,
            K::DuplicateCount,
        );
        err(
            "hugepages=2 default_hugepagesz=1G hugepagesz=1G hugepages=3",
            48,
            K::DuplicateCount,
        );
        err(
            "default_hugepagesz=1G hugepages=2 hugepagesz=1G hugepages=3",
            48,
            K::DuplicateCount,
        );
        err(
            "hugepages=2 default_hugepagesz=2M hugepages=3",
            34,
            K::DuplicateCount,
        );
    }

    #[test]
    fn node_list_errors() {
        // hugepages= is at 0, its value at 10.
        err("hugepages=0:4,,1:2", 14, K::EmptyNodeEntry);
        err("hugepages=,0:4", 10, K::EmptyNodeEntry);
        err("hugepages=0:4,", 13, K::EmptyNodeEntry);
        err("hugepages=\"0:4,\" quiet", 14, K::EmptyNodeEntry);
        err("hugepages=0:4,5", 14, K::MalformedNodeEntry);
        err("hugepages=x:4", 10, K::MalformedNodeEntry);
        err("hugepages=:4", 10, K::MalformedNodeEntry);
        err("hugepages=-1:4", 10, K::MalformedNodeEntry);
        err("hugepages=0:4,1:", 14, K::MalformedCount);
        err("hugepages=0:4:5", 10, K::MalformedCount);
        err("hugepages=0:x", 10, K::MalformedCount);
        err("hugepages=9999:x", 10, K::MalformedCount);
        err("hugepages=1:1,1024:1", 14, K::UnknownNode);
        err("hugepages=99999999999999999999999:1", 10, K::UnknownNode);
        err("hugepages=0:1,1:2,0:3", 18, K::DuplicateNode);
        err("hugepages=0:1,00:3", 14, K::DuplicateNode);
        err("hugepages=0:18446744073709551616", 10, K::CountOverflow);
        err("hugepages=0:18446744073709551615,1:1", 33, K::CountOverflow);

        let mut list: Vec<String> = (0..=MAX_NODE_ENTRIES).map(|n| format!("{n}:1")).collect();
        let s = format!("hugepages={}", list.join(","));
        let at = s.find(",64:1").unwrap() + 1;
        err(&s, at, K::TooManyNodeEntries);
        // Form errors in the entry that does not fit still come first.
        list[MAX_NODE_ENTRIES] = String::from("64:q");
        err(
            &format!("hugepages={}", list.join(",")),
            at,
            K::MalformedCount,
        );
    }

    #[test]
    fn errors_come_in_input_order() {
        // The duplicate at byte 26 is found before the bad size at byte 38, although which size
        // the count at byte 0 is for depends on the last parameter.
        err(
            "hugepages=2 hugepagesz=2M hugepages=3 hugepagesz=5M default_hugepagesz=2M",
            26,
            K::DuplicateCount,
        );
        err(
            "hugepages=1 default_hugepagesz=1G hugepagesz=3M",
            34,
            K::UnsupportedSize,
        );
        // A bad default size is reported where it stands.
        err("hugepages=1 default_hugepagesz=3M", 12, K::UnsupportedSize);
    }

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

    /// xorshift64: deterministic, no dependencies.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            self.0 = x;
            x
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
        fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
            from[self.below(from.len())]
        }
    }

    const FRAGMENTS: &[&str] = &[
        "hugepages=",
        "hugepagesz=",
        "default_hugepagesz=",
        "default-hugepagesz=",
        "hugepages",
        "=",
        "2M",
        "1G",
        "2048K",
        "1048576k",
        "0x",
        "0x200000",
        "0",
        "1",
        "7",
        "9",
        "1023",
        "1024",
        "18446744073709551615",
        "18446744073709551616",
        ":",
        ",",
        " ",
        "\t",
        "\n",
        "\x0b",
        "\"",
        "--",
        "-",
        "_",
        "K",
        "M",
        "G",
        "E",
        "x",
        "é",
        "€",
        "😀",
        "\u{a0}",
        "console=ttyS0",
        "quiet",
    ];

    const SEEDS: &[&str] = &[
        "hugepagesz=1G hugepages=0:4,1:2 hugepagesz=2M hugepages=512",
        "hugepages=256 default_hugepagesz=1G",
        "default_hugepagesz=1G hugepagesz=1G hugepages=3 hugepagesz=2M hugepages=0:1,1:1,2:1",
        "ro quiet \"hugepages=4\" -- hugepages=x",
        "hugepages=\"0:18446744073709551614,7:1\" hugepagesz=0x40000000",
    ];

    /// Everything a successful parse promises, and offsets of errors in range.
    fn check(s: &str) {
        match parse(s) {
            Err(e) => {
                assert!(e.offset < s.len(), "{s:?}: {e:?}");
                assert!(s.is_char_boundary(e.offset), "{s:?}: {e:?}");
                let _ = e.to_string();
            }
            Ok(cfg) => {
                for size in HugeSize::ALL {
                    if let Some(PoolRequest::PerNode(v)) = cfg.request(size) {
                        assert!(v.len() <= MAX_NODE_ENTRIES);
                        let mut sum = 0u64;
                        for (i, e) in v.iter().enumerate() {
                            assert!(e.offset < s.len() && s.is_char_boundary(e.offset));
                            assert!(e.node.index() < MAX_NODES);
                            assert!(v[..i].iter().all(|o| o.node != e.node));
                            sum = sum.checked_add(e.count).expect("sum overflows");
                        }
                        assert_eq!(cfg.total(size), sum);
                        assert!(cfg.validate_nodes(0).is_err());
                    }
                }
                assert_eq!(cfg.validate_nodes(MAX_NODES), Ok(()));
                let _ = format!("{cfg:?}");
            }
        }
        // An unrelated parameter in front only shifts offsets.
        let prefix = "console=ttyS0 ";
        match (parse(s), parse(&format!("{prefix}{s}"))) {
            (Err(a), Err(b)) => {
                assert_eq!(a.kind, b.kind, "{s:?}");
                assert_eq!(a.offset + prefix.len(), b.offset, "{s:?}");
            }
            (Ok(a), Ok(b)) => {
                assert_eq!(a.default_size(), b.default_size(), "{s:?}");
                for size in HugeSize::ALL {
                    assert_eq!(a.total(size), b.total(size), "{s:?}");
                }
            }
            (a, b) => panic!("{s:?}: {a:?} vs {b:?}"),
        }
    }

    #[test]
    fn no_panic_on_random_input() {
        let rounds = if cfg!(miri) { 300 } else { 60_000 };
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut outcomes = [0usize; 2];
        for _ in 0..rounds {
            let mut s = String::new();
            if rng.below(2) == 0 {
                // Random fragments.
                for _ in 0..rng.below(14) {
                    s.push_str(rng.pick(FRAGMENTS));
                }
            } else {
                // A valid line, mutated a few times.
                s.push_str(rng.pick(SEEDS));
                for _ in 0..=rng.below(4) {
                    let mut at = rng.below(s.len() + 1);
                    while !s.is_char_boundary(at) {
                        at -= 1;
                    }
                    match rng.below(3) {
                        0 => s.insert_str(at, rng.pick(FRAGMENTS)),
                        1 => {
                            let mut end = (at + 1 + rng.below(4)).min(s.len());
                            while !s.is_char_boundary(end) {
                                end += 1;
                            }
                            s.replace_range(at..end, "");
                        }
                        _ => {
                            let b = (rng.next() % 0x80) as u8;
                            s.insert(at, char::from(b));
                        }
                    }
                }
            }
            outcomes[usize::from(parse(&s).is_ok())] += 1;
            check(&s);
        }
        // The generator reaches both outcomes often.
        assert!(
            outcomes[0] > rounds / 10 && outcomes[1] > rounds / 10,
            "{outcomes:?}"
        );
    }
}
