//! NUMA topology from a flattened device tree (feature `fdt`).
//!
//! [`parse`] reads what Linux's `drivers/of/of_numa.c` reads and writes it into caller-provided
//! storage ([`FdtTopology`]), without a heap:
//!
//! - memory nodes (`device_type = "memory"`, children of the root) with `reg` and
//!   `numa-node-id`;
//! - CPU nodes (`device_type = "cpu"`, children of `/cpus`) with `numa-node-id`;
//! - the distance map (a child of the root with `compatible = "numa-distance-map-v1"`), whose
//!   `distance-matrix` holds `(from, to, distance)` triples;
//! - `/chosen/bootargs`.
//!
//! The rules follow Linux's:
//! - Without a distance map every distance is Linux's default: 10 local, 20 remote. A triple
//!   `(a, b, d)` sets `dist(a, b)`, and when `b > a` also `dist(b, a)` (a later `(b, a, d')`
//!   triple overrides it), so a one-sided matrix describes a symmetric machine.
//! - A CPU without `numa-node-id` belongs to node 0 (`early_map_cpu_to_node`).
//! - A tree whose memory nodes carry no `numa-node-id` describes a machine without NUMA: one node
//!   0 with all memory and CPUs, whatever CPUs and distance map say (Linux's `dummy_numa_init`).
//! - Memory ranges are rounded inwards to whole 4 KiB frames; a range that holds no whole frame
//!   is dropped.
//!
//! The node count is one more than the largest node id named by a memory node, a CPU or the
//! distance map. Node states are explicit: a node has memory if a memory range names it, and
//! CPUs if a CPU does.
//!
//! # Where Linux is lenient and numaframe is not
//! Linux falls back to one node when a memory node lacks `numa-node-id` while others carry one,
//! and ignores a distance above 255 with a warning. [`parse`] returns a typed [`FdtError`] for
//! both instead: a half-described machine is a firmware bug worth seeing.
//!
//! # Malformed input
//! [`parse`] never panics, whatever the bytes: it checks the header and block bounds itself,
//! then reads the structure block with the `fdt` crate's fallible (`NoPanic`) parser, and decodes
//! every property value it uses with bounds checks. Errors carry the byte offset in the tree.
//!
//! ```
//! use numaframe::fdt::{FdtTopology, parse};
//! use numaframe::{NodeId, NodeInfo, MemoryRange};
//! # fn tree() -> &'static [u8] { include_bytes!("../testdata/qemu-virt-2node.dtb") }
//! let dtb: &[u8] = tree(); // e.g. QEMU's `-machine virt,dumpdtb=…` for a two-node machine
//! let (mut dist, mut infos) = ([0u8; 16], [NodeInfo::default(); 4]);
//! let mut ranges = [MemoryRange { node: NodeId::new(0), range: Default::default() }; 8];
//! let mut cpus = [NodeId::new(0); 8];
//! let mut out = FdtTopology::new(&mut dist, &mut infos, &mut ranges, &mut cpus);
//! let info = parse(dtb, &mut out)?;
//! assert_eq!(out.nodes(), 2);
//! assert_eq!(out.distances(), &[10, 20, 20, 10]);
//! assert_eq!(info.bootargs, Some("hugepagesz=2M hugepages=1"));
//! let topology = out.topology()?;
//! assert!(topology.info(NodeId::new(1)).has_memory);
//! # Ok::<(), Box<dyn core::error::Error>>(())
//! ```
#![deny(unsafe_code)]

use core::fmt;

use ::fdt::nodes::{AsNode, Node};
use ::fdt::parsing::unaligned::UnalignedParser;
use ::fdt::parsing::{NoPanic, ParseError};

use crate::addr::{PAGE_SIZE, PhysAddr, PhysRange};
use crate::error::TopologyError;
use crate::machine::MemoryRange;
use crate::topology::{LOCAL_DISTANCE, MAX_NODES, NodeId, NodeInfo, Topology};

/// Linux's default distance between two different nodes (`REMOTE_DISTANCE`).
pub const REMOTE_DISTANCE: u8 = 20;

/// The FDT magic number.
const MAGIC: u32 = 0xd00d_feed;
/// Bytes in a version-17 header.
const HEADER_BYTES: usize = 40;
const FDT_END: u32 = 9;

/// The parser mode: byte-granular (a tree may sit anywhere) and fallible (never panics).
type Mode<'d> = (UnalignedParser<'d>, NoPanic);
type DtNode<'d> = Node<'d, Mode<'d>>;

/// Which part of a device tree an error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum Block {
    /// The structure block (`off_dt_struct`, `size_dt_struct`).
    Structure,
    /// The strings block (`off_dt_strings`, `size_dt_strings`).
    Strings,
    /// The memory reservation block (`off_mem_rsvmap`).
    Reservations,
}

/// What is wrong with the structure block, as the FDT parser saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum Malformed {
    /// A token that is none of `BEGIN_NODE`, `END_NODE`, `PROP`, `NOP`, `END`.
    BadToken,
    /// A valid token where another was expected (a property after a child node, say).
    UnexpectedToken,
    /// The block ends inside a node, a property or a name.
    Truncated,
    /// A node or property name that is not a NUL-terminated UTF-8 string.
    BadName,
    /// Any other complaint of the parser.
    Other,
}

/// Which caller-provided table of an [`FdtTopology`] was too small.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum Table {
    /// The distance table (`nodes²` entries).
    Distances,
    /// The node descriptions (`nodes` entries).
    Nodes,
    /// The memory ranges.
    Ranges,
    /// The CPU → node list.
    Cpus,
}

/// A device tree that [`parse`] cannot use. Offsets are bytes from the start of the tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum FdtError {
    /// The input is shorter than the header, or than the header's `totalsize`.
    Truncated {
        /// Bytes the header needs.
        needed: usize,
        /// Bytes given.
        len: usize,
    },
    /// The header does not start with `0xd00dfeed`.
    BadMagic {
        /// The first word found.
        magic: u32,
    },
    /// A header older than version 17 (no `size_dt_struct`), or one that is not backwards
    /// compatible with 17.
    UnsupportedVersion {
        /// `version`.
        version: u32,
        /// `last_comp_version`.
        last_compatible: u32,
    },
    /// A block lies outside `totalsize`, is misaligned, or (for the structure block) does not
    /// end with the `END` token.
    BadBlock {
        /// Which block.
        block: Block,
        /// Its offset as the header gives it.
        offset: u32,
        /// Its size as the header gives it (0 for the reservation block, which has none).
        size: u32,
    },
    /// The structure block does not parse.
    Malformed {
        /// Offset of the node being read when the parser gave up (the structure block's start
        /// for the root).
        at: usize,
        /// What the parser found.
        kind: Malformed,
    },
    /// A property value of the wrong length or encoding (`numa-node-id` not one cell, `reg`
    /// not whole entries, a string without its NUL, a `distance-matrix` not whole triples).
    BadProperty {
        /// Offset of the value.
        at: usize,
        /// Its length in bytes.
        len: usize,
    },
    /// `#address-cells` or `#size-cells` other than 1 or 2.
    BadCells {
        /// Offset of the value.
        at: usize,
        /// The cell count.
        cells: u32,
    },
    /// A node id of [`MAX_NODES`] or more.
    NodeIdOutOfRange {
        /// Offset of the value that names it.
        at: usize,
        /// The id.
        id: u32,
    },
    /// A memory node without `numa-node-id` in a tree whose other memory nodes have one.
    MissingNodeId {
        /// Offset of the memory node's name.
        at: usize,
    },
    /// A distance-matrix entry that breaks the SLIT rules (10 from a node to itself, 11..=255
    /// to another).
    BadDistance {
        /// Offset of the triple.
        at: usize,
        /// From this node.
        from: u32,
        /// To this node.
        to: u32,
        /// The distance.
        distance: u32,
    },
    /// A `reg` entry whose end overflows 64 bits.
    BadRange {
        /// Offset of the entry.
        at: usize,
        /// Its base address.
        base: u64,
        /// Its size.
        size: u64,
    },
    /// The tree describes no memory.
    NoMemory,
    /// A caller-provided table is too small.
    NoRoom {
        /// Which table.
        table: Table,
        /// Entries the tree needs.
        needed: usize,
        /// Entries the table has.
        capacity: usize,
    },
}

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Malformed::BadToken => "invalid token",
            Malformed::UnexpectedToken => "unexpected token",
            Malformed::Truncated => "block ends inside a node",
            Malformed::BadName => "name is not a NUL-terminated UTF-8 string",
            Malformed::Other => "malformed structure",
        })
    }
}

impl fmt::Display for FdtError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            FdtError::Truncated { needed, len } => {
                write!(f, "device tree needs {needed} bytes, {len} given")
            }
            FdtError::BadMagic { magic } => write!(f, "bad device tree magic {magic:#010x}"),
            FdtError::UnsupportedVersion {
                version,
                last_compatible,
            } => write!(
                f,
                "unsupported device tree version {version} (compatible with {last_compatible}), need 17"
            ),
            FdtError::BadBlock {
                block,
                offset,
                size,
            } => write!(
                f,
                "device tree {block:?} block at {offset:#x} ({size} bytes) is out of bounds or malformed"
            ),
            FdtError::Malformed { at, kind } => write!(f, "byte {at:#x}: {kind}"),
            FdtError::BadProperty { at, len } => {
                write!(f, "byte {at:#x}: malformed property value of {len} bytes")
            }
            FdtError::BadCells { at, cells } => {
                write!(f, "byte {at:#x}: unsupported cell count {cells}")
            }
            FdtError::NodeIdOutOfRange { at, id } => {
                write!(f, "byte {at:#x}: node id {id} is not below {MAX_NODES}")
            }
            FdtError::MissingNodeId { at } => write!(
                f,
                "byte {at:#x}: memory node without numa-node-id while others have one"
            ),
            FdtError::BadDistance {
                at,
                from,
                to,
                distance,
            } => write!(
                f,
                "byte {at:#x}: invalid distance {distance} from node {from} to {to}"
            ),
            FdtError::BadRange { at, base, size } => {
                write!(
                    f,
                    "byte {at:#x}: memory range {base:#x} + {size:#x} overflows"
                )
            }
            FdtError::NoMemory => f.write_str("device tree describes no memory"),
            FdtError::NoRoom {
                table,
                needed,
                capacity,
            } => write!(
                f,
                "{table:?} table holds {capacity} entries, the tree needs {needed}"
            ),
        }
    }
}

impl core::error::Error for FdtError {}

/// Caller-provided storage that [`parse`] fills: the distance table, node descriptions, memory
/// ranges and the node of each CPU.
///
/// Invariant after a successful [`parse`]: `nodes() >= 1`, and the first `nodes()²` distances,
/// `nodes()` infos, `ranges().len()` ranges and `cpus().len()` CPUs are the tree's.
#[derive(Debug)]
pub struct FdtTopology<'s> {
    distances: &'s mut [u8],
    infos: &'s mut [NodeInfo],
    ranges: &'s mut [MemoryRange],
    cpus: &'s mut [NodeId],
    nodes: usize,
    nranges: usize,
    ncpus: usize,
}

impl<'s> FdtTopology<'s> {
    /// Storage for up to `infos.len()` nodes (with `distances` of at least its square), the given
    /// number of memory ranges and CPUs.
    pub fn new(
        distances: &'s mut [u8],
        infos: &'s mut [NodeInfo],
        ranges: &'s mut [MemoryRange],
        cpus: &'s mut [NodeId],
    ) -> Self {
        Self {
            distances,
            infos,
            ranges,
            cpus,
            nodes: 0,
            nranges: 0,
            ncpus: 0,
        }
    }
    /// Number of nodes (0 before a successful [`parse`]).
    pub fn nodes(&self) -> usize {
        self.nodes
    }
    /// The distance table, row-major: row `i` holds the distances from node `i`.
    pub fn distances(&self) -> &[u8] {
        &self.distances[..self.nodes * self.nodes]
    }
    /// What the tree says about each node.
    pub fn infos(&self) -> &[NodeInfo] {
        &self.infos[..self.nodes]
    }
    /// Mutable node descriptions, for what a device tree does not say (sockets, bandwidth) or
    /// for a platform that reserves all of a node's memory.
    pub fn infos_mut(&mut self) -> &mut [NodeInfo] {
        &mut self.infos[..self.nodes]
    }
    /// The memory ranges, in tree order.
    pub fn ranges(&self) -> &[MemoryRange] {
        &self.ranges[..self.nranges]
    }
    /// The node of each CPU, in tree order (the order of `/cpus`).
    pub fn cpus(&self) -> &[NodeId] {
        &self.cpus[..self.ncpus]
    }
    /// The validated topology (empty before a successful [`parse`]).
    ///
    /// # Errors
    /// The [`TopologyError`] of [`Topology::new`]: [`TopologyError::NoNodes`] before a
    /// successful [`parse`], and for tables edited through [`FdtTopology::infos_mut`] that
    /// break its rules.
    pub fn topology(&self) -> Result<Topology<'_>, TopologyError> {
        Topology::new(self.distances(), self.infos())
    }
}

/// What [`parse`] found besides the topology.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FdtInfo<'d> {
    /// `totalsize` from the header: the bytes the tree occupies, to reserve.
    pub total_size: usize,
    /// `boot_cpuid_phys` from the header.
    pub boot_cpuid: u32,
    /// `/chosen/bootargs`, without its NUL.
    pub bootargs: Option<&'d str>,
    /// `true` if memory nodes carry `numa-node-id` (otherwise the machine is one node).
    pub numa: bool,
}

/// The header fields [`parse`] uses, after validation.
#[derive(Clone, Copy, Debug)]
struct Header {
    total_size: usize,
    off_rsvmap: usize,
    boot_cpuid: u32,
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    let w = b.get(at..at.checked_add(4)?)?;
    Some(u32::from_be_bytes([w[0], w[1], w[2], w[3]]))
}

fn be64(b: &[u8], at: usize) -> Option<u64> {
    Some((u64::from(be32(b, at)?) << 32) | u64::from(be32(b, at + 4)?))
}

impl Header {
    /// Checks the header and that every block lies inside `totalsize` bytes of `dtb`.
    fn read(dtb: &[u8]) -> Result<Header, FdtError> {
        let word = |i: usize| {
            be32(dtb, i * 4).ok_or(FdtError::Truncated {
                needed: HEADER_BYTES,
                len: dtb.len(),
            })
        };
        let magic = word(0)?;
        if magic != MAGIC {
            return Err(FdtError::BadMagic { magic });
        }
        if dtb.len() < HEADER_BYTES {
            return Err(FdtError::Truncated {
                needed: HEADER_BYTES,
                len: dtb.len(),
            });
        }
        let [
            total,
            off_struct,
            off_strings,
            off_rsvmap,
            version,
            last_comp,
            boot_cpuid,
        ] = [1, 2, 3, 4, 5, 6, 7].map(|i| word(i).unwrap_or(0));
        let [size_strings, size_struct] = [8, 9].map(|i| word(i).unwrap_or(0));
        if version < 17 || last_comp > 17 {
            return Err(FdtError::UnsupportedVersion {
                version,
                last_compatible: last_comp,
            });
        }
        let total_size = total as usize;
        if total_size > dtb.len() || total_size < HEADER_BYTES {
            return Err(FdtError::Truncated {
                needed: total_size.max(HEADER_BYTES),
                len: dtb.len(),
            });
        }
        let inside = |off: u32, size: u32| {
            (off as usize) >= HEADER_BYTES
                && (off as usize)
                    .checked_add(size as usize)
                    .is_some_and(|end| end <= total_size)
        };
        // The structure block is word aligned, whole words, and ends with END: the parser
        // relies on the last word being there.
        let bad_struct = FdtError::BadBlock {
            block: Block::Structure,
            offset: off_struct,
            size: size_struct,
        };
        if !inside(off_struct, size_struct)
            || off_struct % 4 != 0
            || size_struct % 4 != 0
            || size_struct < 8
        {
            return Err(bad_struct);
        }
        if be32(dtb, (off_struct + size_struct - 4) as usize) != Some(FDT_END) {
            return Err(bad_struct);
        }
        if !inside(off_strings, size_strings) {
            return Err(FdtError::BadBlock {
                block: Block::Strings,
                offset: off_strings,
                size: size_strings,
            });
        }
        if !inside(off_rsvmap, 16) || off_rsvmap % 8 != 0 {
            return Err(FdtError::BadBlock {
                block: Block::Reservations,
                offset: off_rsvmap,
                size: 0,
            });
        }
        Ok(Header {
            total_size,
            off_rsvmap: off_rsvmap as usize,
            boot_cpuid,
        })
    }
}

/// The byte offset of `part` (a slice of the tree) in `dtb`.
fn offset_in(dtb: &[u8], part: &[u8]) -> usize {
    part.as_ptr().addr().wrapping_sub(dtb.as_ptr().addr())
}

fn malformed(e: ::fdt::FdtError, at: usize) -> FdtError {
    let kind = match e {
        ::fdt::FdtError::ParseError(p) => match p {
            ParseError::InvalidTokenValue => Malformed::BadToken,
            ParseError::UnexpectedToken => Malformed::UnexpectedToken,
            ParseError::UnexpectedEndOfData => Malformed::Truncated,
            ParseError::InvalidCStrValue => Malformed::BadName,
            _ => Malformed::Other,
        },
        ::fdt::FdtError::InvalidNodeName => Malformed::BadName,
        _ => Malformed::Other,
    };
    FdtError::Malformed { at, kind }
}

/// The properties numaframe reads, from one pass over a node's properties.
#[derive(Clone, Copy, Debug, Default)]
struct Props<'d> {
    device_type: Option<&'d [u8]>,
    status: Option<&'d [u8]>,
    compatible: Option<&'d [u8]>,
    reg: Option<&'d [u8]>,
    node_id: Option<&'d [u8]>,
    address_cells: Option<&'d [u8]>,
    size_cells: Option<&'d [u8]>,
    distance_matrix: Option<&'d [u8]>,
    bootargs: Option<&'d [u8]>,
    method: Option<&'d [u8]>,
}

/// One node of the tree, its offset and name.
#[derive(Clone, Copy)]
struct Visit<'d> {
    node: DtNode<'d>,
    at: usize,
    name: &'d str,
}

struct Tree<'d> {
    dtb: &'d [u8],
    header: Header,
    root: DtNode<'d>,
    root_at: usize,
}

impl<'d> Tree<'d> {
    fn open(dtb: &'d [u8]) -> Result<Tree<'d>, FdtError> {
        let header = Header::read(dtb)?;
        let data = &dtb[..header.total_size];
        let root_at = be32(dtb, 8).unwrap_or(0) as usize;
        let fdt = ::fdt::Fdt::new_unaligned_fallible(data).map_err(|e| malformed(e, root_at))?;
        let root = fdt.root().map_err(|e| malformed(e, root_at))?.as_node();
        Ok(Tree {
            dtb,
            header,
            root,
            root_at,
        })
    }

    fn props(&self, v: &Visit<'d>) -> Result<Props<'d>, FdtError> {
        let mut p = Props::default();
        let list = v.node.properties().map_err(|e| malformed(e, v.at))?;
        for prop in list.iter() {
            let prop = prop.map_err(|e| malformed(e, v.at))?;
            let slot = match prop.name {
                "device_type" => &mut p.device_type,
                "status" => &mut p.status,
                "compatible" => &mut p.compatible,
                "reg" => &mut p.reg,
                "numa-node-id" => &mut p.node_id,
                "#address-cells" => &mut p.address_cells,
                "#size-cells" => &mut p.size_cells,
                "distance-matrix" => &mut p.distance_matrix,
                "bootargs" => &mut p.bootargs,
                "method" => &mut p.method,
                _ => continue,
            };
            // The first occurrence wins, as in libfdt's lookups.
            slot.get_or_insert(prop.value);
        }
        Ok(p)
    }

    /// Calls `f` with each child of `parent`, stopping at the first error.
    fn children(
        &self,
        parent: &Visit<'d>,
        mut f: impl FnMut(Visit<'d>) -> Result<(), FdtError>,
    ) -> Result<(), FdtError> {
        let kids = parent
            .node
            .children()
            .map_err(|e| malformed(e, parent.at))?;
        for child in kids.iter() {
            let node = child.map_err(|e| malformed(e, parent.at))?;
            let name = node.name().map_err(|e| malformed(e, parent.at))?.name;
            let at = offset_in(self.dtb, name.as_bytes());
            f(Visit { node, at, name })?;
        }
        Ok(())
    }

    fn root(&self) -> Visit<'d> {
        Visit {
            node: self.root,
            at: self.root_at,
            name: "",
        }
    }

    fn string(&self, value: &'d [u8]) -> Result<&'d str, FdtError> {
        let bad = FdtError::BadProperty {
            at: offset_in(self.dtb, value),
            len: value.len(),
        };
        let (last, text) = value.split_last().ok_or(bad)?;
        if *last != 0 {
            return Err(bad);
        }
        core::str::from_utf8(text).map_err(|_| bad)
    }

    fn u32_value(&self, value: &'d [u8]) -> Result<u32, FdtError> {
        if value.len() != 4 {
            return Err(FdtError::BadProperty {
                at: offset_in(self.dtb, value),
                len: value.len(),
            });
        }
        be32(value, 0).ok_or(FdtError::BadProperty {
            at: offset_in(self.dtb, value),
            len: value.len(),
        })
    }

    fn cells(&self, value: Option<&'d [u8]>, default: u32) -> Result<u32, FdtError> {
        let Some(v) = value else {
            return Ok(default);
        };
        match self.u32_value(v)? {
            c @ (1 | 2) => Ok(c),
            cells => Err(FdtError::BadCells {
                at: offset_in(self.dtb, v),
                cells,
            }),
        }
    }

    fn node_id(&self, value: &'d [u8]) -> Result<NodeId, FdtError> {
        let id = self.u32_value(value)?;
        NodeId::try_new(id as usize).ok_or(FdtError::NodeIdOutOfRange {
            at: offset_in(self.dtb, value),
            id,
        })
    }

    /// Calls `f(offset, base, size)` for each `(address, size)` entry of a `reg` value.
    fn reg(
        &self,
        value: &'d [u8],
        (ac, sc): (u32, u32),
        mut f: impl FnMut(usize, u64, u64) -> Result<(), FdtError>,
    ) -> Result<(), FdtError> {
        let entry = ((ac + sc) * 4) as usize;
        if value.is_empty() || !value.len().is_multiple_of(entry) {
            return Err(FdtError::BadProperty {
                at: offset_in(self.dtb, value),
                len: value.len(),
            });
        }
        let read = |b: &[u8], at: usize, cells: u32| {
            if cells == 2 {
                be64(b, at).unwrap_or(0)
            } else {
                u64::from(be32(b, at).unwrap_or(0))
            }
        };
        for e in value.chunks_exact(entry) {
            let base = read(e, 0, ac);
            let size = read(e, (ac * 4) as usize, sc);
            f(offset_in(self.dtb, e), base, size)?;
        }
        Ok(())
    }
}

fn is(value: Option<&[u8]>, s: &str) -> bool {
    value.is_some_and(|v| v.strip_suffix(&[0]) == Some(s.as_bytes()))
}

fn available(p: &Props<'_>) -> bool {
    p.status.is_none() || is(p.status, "okay") || is(p.status, "ok")
}

fn compatible_with(p: &Props<'_>, s: &str) -> bool {
    p.compatible
        .is_some_and(|v| v.split(|b| *b == 0).any(|c| c == s.as_bytes()))
}

/// The frames wholly inside `base..base + size`, or `None` if there is none.
fn whole_frames(base: u64, end: u64) -> Option<PhysRange> {
    let start = base.checked_next_multiple_of(PAGE_SIZE)?;
    let end = end - end % PAGE_SIZE;
    if start >= end {
        return None;
    }
    PhysRange::from_bytes(PhysAddr::new(start), end - start)
}

/// Reads the NUMA topology, memory and CPUs of `dtb` into `out`.
///
/// # Errors
/// An [`FdtError`] for a malformed tree, a NUMA description that breaks Linux's rules (see the
/// module docs), or tables in `out` too small for the tree (then [`FdtError::NoRoom`] says how
/// many entries it needs). `out` may be partly written on error.
pub fn parse<'d>(dtb: &'d [u8], out: &mut FdtTopology<'_>) -> Result<FdtInfo<'d>, FdtError> {
    out.nodes = 0;
    out.nranges = 0;
    out.ncpus = 0;
    let tree = Tree::open(dtb)?;
    let root = tree.root();
    let rp = tree.props(&root)?;
    let cells = (
        tree.cells(rp.address_cells, 2)?,
        tree.cells(rp.size_cells, 1)?,
    );

    let mut max_id = 0usize;
    let mut numa = false;
    let mut missing_id: Option<usize> = None;
    let mut matrix: Option<&'d [u8]> = None;
    let mut bootargs = None;
    let mut memory_nodes = 0usize;
    let (mut nranges, mut ncpus) = (0usize, 0usize);

    tree.children(&root, |child| {
        let p = tree.props(&child)?;
        if !available(&p) {
            return Ok(());
        }
        if is(p.device_type, "memory") {
            memory_nodes += 1;
            let node = match p.node_id {
                Some(v) => {
                    numa = true;
                    tree.node_id(v)?
                }
                None => {
                    missing_id.get_or_insert(child.at);
                    NodeId::new(0)
                }
            };
            max_id = max_id.max(node.index());
            let reg = p.reg.ok_or(FdtError::BadProperty {
                at: child.at,
                len: 0,
            })?;
            tree.reg(reg, cells, |at, base, size| {
                let end = base
                    .checked_add(size)
                    .ok_or(FdtError::BadRange { at, base, size })?;
                if let Some(range) = whole_frames(base, end) {
                    if let Some(slot) = out.ranges.get_mut(nranges) {
                        *slot = MemoryRange { node, range };
                    }
                    nranges += 1;
                }
                Ok(())
            })?;
        } else if child.name == "cpus" {
            tree.children(&child, |cpu| {
                let cp = tree.props(&cpu)?;
                if !is(cp.device_type, "cpu") || !available(&cp) {
                    return Ok(());
                }
                let node = match cp.node_id {
                    Some(v) => tree.node_id(v)?,
                    None => NodeId::new(0),
                };
                if let Some(slot) = out.cpus.get_mut(ncpus) {
                    *slot = node;
                }
                ncpus += 1;
                Ok(())
            })?;
        } else if child.name == "chosen" {
            if let Some(v) = p.bootargs {
                bootargs = Some(tree.string(v)?);
            }
        } else if compatible_with(&p, "numa-distance-map-v1") && matrix.is_none() {
            matrix = Some(p.distance_matrix.ok_or(FdtError::BadProperty {
                at: child.at,
                len: 0,
            })?);
        }
        Ok(())
    })?;

    if memory_nodes == 0 || nranges == 0 {
        return Err(FdtError::NoMemory);
    }
    if numa && let Some(at) = missing_id {
        return Err(FdtError::MissingNodeId { at });
    }
    if nranges > out.ranges.len() {
        return Err(FdtError::NoRoom {
            table: Table::Ranges,
            needed: nranges,
            capacity: out.ranges.len(),
        });
    }
    if ncpus > out.cpus.len() {
        return Err(FdtError::NoRoom {
            table: Table::Cpus,
            needed: ncpus,
            capacity: out.cpus.len(),
        });
    }

    if numa {
        max_id = out.cpus[..ncpus]
            .iter()
            .map(|n| n.index())
            .fold(max_id, usize::max);
        if let Some(m) = matrix {
            for_each_triple(&tree, m, |_, a, b, _| {
                max_id = max_id.max(a.index()).max(b.index());
                Ok(())
            })?;
        }
    } else {
        // No NUMA: one node with everything (Linux's `dummy_numa_init`).
        out.cpus[..ncpus].fill(NodeId::new(0));
    }
    let n = max_id + 1;
    if n > out.infos.len() {
        return Err(FdtError::NoRoom {
            table: Table::Nodes,
            needed: n,
            capacity: out.infos.len(),
        });
    }
    if n * n > out.distances.len() {
        return Err(FdtError::NoRoom {
            table: Table::Distances,
            needed: n * n,
            capacity: out.distances.len(),
        });
    }
    let dist = &mut out.distances[..n * n];
    for (i, d) in dist.iter_mut().enumerate() {
        *d = if i / n == i % n {
            LOCAL_DISTANCE
        } else {
            REMOTE_DISTANCE
        };
    }
    if let (true, Some(m)) = (numa, matrix) {
        for_each_triple(&tree, m, |_, a, b, d| {
            let (a, b) = (a.index(), b.index());
            dist[a * n + b] = d;
            if b > a {
                dist[b * n + a] = d;
            }
            Ok(())
        })?;
    }
    let infos = &mut out.infos[..n];
    infos.fill(NodeInfo::default());
    for r in &out.ranges[..nranges] {
        infos[r.node.index()].has_memory = true;
    }
    for c in &out.cpus[..ncpus] {
        infos[c.index()].has_cpus = true;
    }
    out.nodes = n;
    out.nranges = nranges;
    out.ncpus = ncpus;
    Ok(FdtInfo {
        total_size: tree.header.total_size,
        boot_cpuid: tree.header.boot_cpuid,
        bootargs,
        numa,
    })
}

/// Calls `f(offset, from, to, distance)` for each valid triple of a `distance-matrix`.
fn for_each_triple<'d>(
    tree: &Tree<'d>,
    m: &'d [u8],
    mut f: impl FnMut(usize, NodeId, NodeId, u8) -> Result<(), FdtError>,
) -> Result<(), FdtError> {
    if m.is_empty() || !m.len().is_multiple_of(12) {
        return Err(FdtError::BadProperty {
            at: offset_in(tree.dtb, m),
            len: m.len(),
        });
    }
    for t in m.chunks_exact(12) {
        let at = offset_in(tree.dtb, t);
        let [a, b, d] = [0, 4, 8].map(|i| be32(t, i).unwrap_or(0));
        let id = |id: u32, off: usize| {
            NodeId::try_new(id as usize).ok_or(FdtError::NodeIdOutOfRange { at: at + off, id })
        };
        let (from, to) = (id(a, 0)?, id(b, 4)?);
        let ok = if a == b {
            d == u32::from(LOCAL_DISTANCE)
        } else {
            d > u32::from(LOCAL_DISTANCE) && d <= 255
        };
        if !ok {
            return Err(FdtError::BadDistance {
                at,
                from: a,
                to: b,
                distance: d,
            });
        }
        f(at, from, to, d as u8)?;
    }
    Ok(())
}

/// Calls `f` with each memory reservation of `dtb`: the header's reservation block
/// (`/memreserve/`) and the `reg` ranges of the children of `/reserved-memory`. A platform
/// keeps these out of the ranges it gives the allocator.
///
/// # Errors
/// An [`FdtError`] for a malformed tree or reservation.
pub fn for_each_reservation(dtb: &[u8], mut f: impl FnMut(PhysAddr, u64)) -> Result<(), FdtError> {
    let tree = Tree::open(dtb)?;
    let mut at = tree.header.off_rsvmap;
    loop {
        let entry = (be64(dtb, at), be64(dtb, at + 8));
        let (Some(base), Some(size)) = entry else {
            return Err(FdtError::BadBlock {
                block: Block::Reservations,
                offset: tree.header.off_rsvmap as u32,
                size: 0,
            });
        };
        if at + 16 > tree.header.total_size {
            return Err(FdtError::BadBlock {
                block: Block::Reservations,
                offset: tree.header.off_rsvmap as u32,
                size: 0,
            });
        }
        if base == 0 && size == 0 {
            break;
        }
        f(PhysAddr::new(base), size);
        at += 16;
    }
    let root = tree.root();
    tree.children(&root, |child| {
        if child.name != "reserved-memory" {
            return Ok(());
        }
        let p = tree.props(&child)?;
        let cells = (
            tree.cells(p.address_cells, 2)?,
            tree.cells(p.size_cells, 1)?,
        );
        tree.children(&child, |region| {
            let rp = tree.props(&region)?;
            if let (Some(reg), true) = (rp.reg, available(&rp)) {
                tree.reg(reg, cells, |_, base, size| {
                    f(PhysAddr::new(base), size);
                    Ok(())
                })?;
            }
            Ok(())
        })
    })
}

/// The string property `name` of the node at `path` (`/psci`, `/chosen`; a component without a
/// unit address matches the first child of that name with any), or `None` if either is absent.
///
/// # Errors
/// An [`FdtError`] for a malformed tree or a value that is not a NUL-terminated UTF-8 string.
pub fn string_property<'d>(
    dtb: &'d [u8],
    path: &str,
    name: &str,
) -> Result<Option<&'d str>, FdtError> {
    let tree = Tree::open(dtb)?;
    let mut at = tree.root();
    for part in path.split('/').filter(|p| !p.is_empty()) {
        let mut found = None;
        tree.children(&at, |child| {
            let full = child.node.name().map_err(|e| malformed(e, child.at))?;
            let hit = if part.contains('@') {
                full.unit_address
                    .is_some_and(|u| part.split_once('@') == Some((full.name, u)))
            } else {
                full.name == part
            };
            if hit && found.is_none() {
                found = Some(child);
            }
            Ok(())
        })?;
        match found {
            Some(v) => at = v,
            None => return Ok(None),
        }
    }
    let list = at.node.properties().map_err(|e| malformed(e, at.at))?;
    for prop in list.iter() {
        let prop = prop.map_err(|e| malformed(e, at.at))?;
        if prop.name == name {
            return tree.string(prop.value).map(Some);
        }
    }
    Ok(None)
}

#[cfg(test)]
pub(crate) mod build {
    //! A small device-tree writer for tests (`dtc` in a few lines).
    extern crate std;
    use std::vec::Vec;

    /// A node: name, properties (name, raw value), children.
    #[derive(Clone, Debug, Default)]
    pub(crate) struct TestNode {
        pub(crate) name: &'static str,
        pub(crate) props: Vec<(&'static str, Vec<u8>)>,
        pub(crate) children: Vec<TestNode>,
    }

    pub(crate) fn cells(v: &[u32]) -> Vec<u8> {
        v.iter().flat_map(|c| c.to_be_bytes()).collect()
    }

    pub(crate) fn string(s: &str) -> Vec<u8> {
        let mut v = s.as_bytes().to_vec();
        v.push(0);
        v
    }

    impl TestNode {
        pub(crate) fn new(name: &'static str) -> Self {
            Self {
                name,
                ..Self::default()
            }
        }
        pub(crate) fn prop(mut self, name: &'static str, value: Vec<u8>) -> Self {
            self.props.push((name, value));
            self
        }
        pub(crate) fn child(mut self, c: TestNode) -> Self {
            self.children.push(c);
            self
        }
    }

    fn emit(n: &TestNode, s: &mut Vec<u8>, strings: &mut Vec<u8>) {
        s.extend(1u32.to_be_bytes());
        s.extend(n.name.as_bytes());
        s.push(0);
        while !s.len().is_multiple_of(4) {
            s.push(0);
        }
        for (name, value) in &n.props {
            let off = match strings
                .windows(name.len() + 1)
                .position(|w| &w[..name.len()] == name.as_bytes() && w[name.len()] == 0)
            {
                Some(o) => o,
                None => {
                    let o = strings.len();
                    strings.extend(name.as_bytes());
                    strings.push(0);
                    o
                }
            };
            s.extend(3u32.to_be_bytes());
            s.extend((value.len() as u32).to_be_bytes());
            s.extend((off as u32).to_be_bytes());
            s.extend(value);
            while !s.len().is_multiple_of(4) {
                s.push(0);
            }
        }
        for c in &n.children {
            emit(c, s, strings);
        }
        s.extend(2u32.to_be_bytes());
    }

    /// The blob of `root` with the given memory reservations.
    pub(crate) fn blob(root: &TestNode, reservations: &[(u64, u64)]) -> Vec<u8> {
        let (mut s, mut strings) = (Vec::new(), Vec::new());
        emit(root, &mut s, &mut strings);
        s.extend(9u32.to_be_bytes());
        let off_rsv = 40u32;
        let rsv_len = (reservations.len() as u32 + 1) * 16;
        let off_struct = off_rsv + rsv_len;
        let off_strings = off_struct + s.len() as u32;
        let total = off_strings + strings.len() as u32;
        let mut out = Vec::new();
        for w in [
            0xd00d_feed,
            total,
            off_struct,
            off_strings,
            off_rsv,
            17,
            16,
            0,
            strings.len() as u32,
            s.len() as u32,
        ] {
            out.extend(u32::to_be_bytes(w));
        }
        for &(b, l) in reservations.iter().chain(&[(0, 0)]) {
            out.extend(b.to_be_bytes());
            out.extend(l.to_be_bytes());
        }
        out.extend(s);
        out.extend(strings);
        out
    }

    /// A QEMU-virt-like tree: `mem[i] = (node, base, size)`, `cpus[i] = node`,
    /// `matrix` triples.
    pub(crate) fn machine(
        mem: &[(Option<u32>, u64, u64)],
        cpus: &[Option<u32>],
        matrix: Option<&[(u32, u32, u32)]>,
        bootargs: Option<&str>,
    ) -> Vec<u8> {
        let mut root = TestNode::new("")
            .prop("#address-cells", cells(&[2]))
            .prop("#size-cells", cells(&[2]))
            .prop("compatible", string("linux,dummy-virt"));
        let mut chosen = TestNode::new("chosen");
        if let Some(b) = bootargs {
            chosen = chosen.prop("bootargs", string(b));
        }
        root = root.child(chosen);
        for &(node, base, size) in mem {
            let mut m = TestNode::new("memory@0")
                .prop("device_type", string("memory"))
                .prop(
                    "reg",
                    cells(&[
                        (base >> 32) as u32,
                        base as u32,
                        (size >> 32) as u32,
                        size as u32,
                    ]),
                );
            if let Some(id) = node {
                m = m.prop("numa-node-id", cells(&[id]));
            }
            root = root.child(m);
        }
        let mut cpu_list = TestNode::new("cpus")
            .prop("#address-cells", cells(&[1]))
            .prop("#size-cells", cells(&[0]))
            .child(TestNode::new("cpu-map").child(TestNode::new("socket0")));
        for (i, &node) in cpus.iter().enumerate() {
            let mut c = TestNode::new("cpu@0")
                .prop("device_type", string("cpu"))
                .prop("reg", cells(&[i as u32]))
                .prop("compatible", string("arm,cortex-a57"));
            if let Some(id) = node {
                c = c.prop("numa-node-id", cells(&[id]));
            }
            cpu_list = cpu_list.child(c);
        }
        root = root.child(cpu_list);
        if let Some(m) = matrix {
            let flat: Vec<u32> = m.iter().flat_map(|&(a, b, d)| [a, b, d]).collect();
            root = root.child(
                TestNode::new("distance-map")
                    .prop("compatible", string("numa-distance-map-v1"))
                    .prop("distance-matrix", cells(&flat)),
            );
        }
        root = root.child(TestNode::new("psci").prop("method", string("hvc")));
        blob(&root, &[])
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec;
    use std::vec::Vec;

    use super::build::*;
    use super::*;
    use crate::addr::Pfn;

    const G: u64 = 1 << 30;

    struct Out {
        dist: Vec<u8>,
        infos: Vec<NodeInfo>,
        ranges: Vec<MemoryRange>,
        cpus: Vec<NodeId>,
    }

    impl Out {
        fn new(nodes: usize, ranges: usize, cpus: usize) -> Out {
            Out {
                dist: vec![0; nodes * nodes],
                infos: vec![NodeInfo::default(); nodes],
                ranges: vec![
                    MemoryRange {
                        node: NodeId::new(0),
                        range: PhysRange::default()
                    };
                    ranges
                ],
                cpus: vec![NodeId::new(0); cpus],
            }
        }
        fn topo(&mut self) -> FdtTopology<'_> {
            FdtTopology::new(
                &mut self.dist,
                &mut self.infos,
                &mut self.ranges,
                &mut self.cpus,
            )
        }
    }

    fn n(i: usize) -> NodeId {
        NodeId::new(i)
    }

    fn amd() -> Vec<u8> {
        let d = [
            [10, 12, 32, 32],
            [12, 10, 32, 32],
            [32, 32, 10, 12],
            [32, 32, 12, 10],
        ];
        let m: Vec<_> = (0..4)
            .flat_map(|a| (0..4).map(move |b| (a as u32, b as u32, d[a][b])))
            .collect();
        let mem: Vec<_> = (0..4)
            .map(|i| (Some(i as u32), G + i as u64 * G, G))
            .collect();
        machine(
            &mem,
            &[Some(0), Some(1), Some(2), Some(3)],
            Some(&m),
            Some("hugepagesz=2M hugepages=4 numaframe.linux_boot_order"),
        )
    }

    #[test]
    fn four_nodes_like_qemu() {
        let dtb = amd();
        let mut o = Out::new(8, 8, 8);
        let mut t = o.topo();
        let info = parse(&dtb, &mut t).unwrap();
        assert_eq!(t.nodes(), 4);
        assert_eq!(
            t.distances(),
            &[
                10, 12, 32, 32, 12, 10, 32, 32, 32, 32, 10, 12, 32, 32, 12, 10
            ]
        );
        assert_eq!(t.cpus(), &[n(0), n(1), n(2), n(3)]);
        assert_eq!(t.ranges().len(), 4);
        assert_eq!(t.ranges()[2].node, n(2));
        assert_eq!(t.ranges()[2].range.start(), Pfn::new(3 * G / PAGE_SIZE));
        assert!(t.infos().iter().all(|i| i.has_cpus && i.has_memory));
        assert_eq!(
            info.bootargs,
            Some("hugepagesz=2M hugepages=4 numaframe.linux_boot_order")
        );
        assert!(info.numa);
        assert_eq!(info.total_size, dtb.len());
        t.topology().unwrap();
        assert_eq!(string_property(&dtb, "/psci", "method"), Ok(Some("hvc")));
        assert_eq!(string_property(&dtb, "/nothing", "method"), Ok(None));
        assert_eq!(
            string_property(&dtb, "/chosen", "bootargs").unwrap(),
            info.bootargs
        );
    }

    #[test]
    fn defaults_cpuless_and_memoryless_nodes() {
        // Node 1 has memory but no CPU; node 2 a CPU but no memory; no distance map; the
        // last CPU has no id and goes to node 0.
        let dtb = machine(
            &[(Some(0), G, G), (Some(1), 2 * G, G)],
            &[Some(0), Some(2), None],
            None,
            None,
        );
        let mut o = Out::new(4, 4, 4);
        let mut t = o.topo();
        let info = parse(&dtb, &mut t).unwrap();
        assert_eq!(info.bootargs, None);
        assert_eq!(t.nodes(), 3);
        assert_eq!(t.distances(), &[10, 20, 20, 20, 10, 20, 20, 20, 10]);
        let i = t.infos();
        assert!(i[0].has_cpus && i[0].has_memory);
        assert!(!i[1].has_cpus && i[1].has_memory);
        assert!(i[2].has_cpus && !i[2].has_memory);
        assert_eq!(t.cpus(), &[n(0), n(2), n(0)]);
    }

    #[test]
    fn one_sided_matrix_is_mirrored_and_later_entries_win() {
        let dtb = machine(
            &[(Some(0), G, G), (Some(1), 2 * G, G)],
            &[Some(0), Some(1)],
            Some(&[(0, 0, 10), (0, 1, 15), (1, 1, 10)]),
            None,
        );
        let mut o = Out::new(2, 2, 2);
        let mut t = o.topo();
        parse(&dtb, &mut t).unwrap();
        assert_eq!(t.distances(), &[10, 15, 15, 10]);
        let dtb = machine(
            &[(Some(0), G, G), (Some(1), 2 * G, G)],
            &[Some(0), Some(1)],
            Some(&[(0, 1, 15), (1, 0, 25)]),
            None,
        );
        let mut t = o.topo();
        parse(&dtb, &mut t).unwrap();
        assert_eq!(t.distances(), &[10, 15, 25, 10]);
    }

    #[test]
    fn without_numa_ids_the_machine_is_one_node() {
        let dtb = machine(
            &[(None, G, G), (None, 3 * G, G)],
            &[Some(1), None],
            Some(&[(0, 1, 15)]),
            None,
        );
        let mut o = Out::new(1, 2, 2);
        let mut t = o.topo();
        let info = parse(&dtb, &mut t).unwrap();
        assert!(!info.numa);
        assert_eq!(t.nodes(), 1);
        assert_eq!(t.cpus(), &[n(0), n(0)]);
        assert_eq!(t.ranges().len(), 2);
        assert_eq!(t.distances(), &[10]);
    }

    #[test]
    fn ranges_round_inwards() {
        let dtb = machine(
            &[(Some(0), G + 100, 2 * PAGE_SIZE), (Some(0), 2 * G, 100)],
            &[],
            None,
            None,
        );
        let mut o = Out::new(1, 2, 0);
        let mut t = o.topo();
        parse(&dtb, &mut t).unwrap();
        let r = t.ranges();
        assert_eq!(r.len(), 1, "the 100-byte range holds no whole frame");
        assert_eq!(r[0].range.frames(), 1);
        assert_eq!(r[0].range.start().addr().get(), G + PAGE_SIZE);
    }

    #[test]
    fn typed_errors() {
        let mut o = Out::new(4, 8, 8);
        let mut check = |dtb: &[u8], want: fn(&FdtError) -> bool| {
            let e = parse(dtb, &mut o.topo()).unwrap_err();
            assert!(want(&e), "{e:?}");
            let _ = std::format!("{e}");
        };
        check(&[], |e| matches!(e, FdtError::Truncated { .. }));
        check(&[0; 64], |e| matches!(e, FdtError::BadMagic { magic: 0 }));
        let good = amd();
        check(&good[..good.len() - 1], |e| {
            matches!(e, FdtError::Truncated { .. })
        });
        let mut v16 = good.clone();
        v16[20..24].copy_from_slice(&16u32.to_be_bytes());
        check(&v16, |e| {
            matches!(e, FdtError::UnsupportedVersion { version: 16, .. })
        });
        let mut far = good.clone();
        far[12..16].copy_from_slice(&u32::MAX.to_be_bytes());
        check(&far, |e| {
            matches!(
                e,
                FdtError::BadBlock {
                    block: Block::Strings,
                    ..
                }
            )
        });
        check(
            &machine(&[(Some(0), G, G), (None, 2 * G, G)], &[], None, None),
            |e| matches!(e, FdtError::MissingNodeId { .. }),
        );
        check(&machine(&[(Some(5000), G, G)], &[], None, None), |e| {
            matches!(e, FdtError::NodeIdOutOfRange { id: 5000, .. })
        });
        check(
            &machine(&[(Some(0), G, G)], &[], Some(&[(0, 0, 12)]), None),
            |e| matches!(e, FdtError::BadDistance { distance: 12, .. }),
        );
        check(
            &machine(
                &[(Some(0), G, G), (Some(1), 2 * G, G)],
                &[],
                Some(&[(0, 1, 300)]),
                None,
            ),
            |e| matches!(e, FdtError::BadDistance { distance: 300, .. }),
        );
        check(&machine(&[(Some(0), u64::MAX, G)], &[], None, None), |e| {
            matches!(e, FdtError::BadRange { .. })
        });
        check(&machine(&[], &[Some(0)], None, None), |e| {
            matches!(e, FdtError::NoMemory)
        });
        check(&machine(&[(Some(7), G, G)], &[], None, None), |e| {
            matches!(
                e,
                FdtError::NoRoom {
                    table: Table::Nodes,
                    needed: 8,
                    ..
                }
            )
        });
        // A numa-node-id of two cells.
        let root = TestNode::new("").child(
            TestNode::new("memory@0")
                .prop("device_type", string("memory"))
                .prop("reg", cells(&[0, 1 << 30, 0, 1 << 30]))
                .prop("numa-node-id", cells(&[0, 0])),
        );
        check(&blob(&root, &[]), |e| {
            matches!(e, FdtError::BadProperty { len: 8, .. })
        });
        let root = TestNode::new("")
            .prop("#address-cells", cells(&[3]))
            .child(TestNode::new("memory@0"));
        check(&blob(&root, &[]), |e| {
            matches!(e, FdtError::BadCells { cells: 3, .. })
        });
    }

    #[test]
    fn no_room_says_how_much() {
        let dtb = amd();
        let mut o = Out::new(4, 2, 8);
        assert_eq!(
            parse(&dtb, &mut o.topo()),
            Err(FdtError::NoRoom {
                table: Table::Ranges,
                needed: 4,
                capacity: 2
            })
        );
        let mut o = Out::new(4, 4, 1);
        assert_eq!(
            parse(&dtb, &mut o.topo()),
            Err(FdtError::NoRoom {
                table: Table::Cpus,
                needed: 4,
                capacity: 1
            })
        );
    }

    #[test]
    fn reservations() {
        let root = TestNode::new("")
            .prop("#address-cells", cells(&[2]))
            .prop("#size-cells", cells(&[2]))
            .child(
                TestNode::new("reserved-memory")
                    .prop("#address-cells", cells(&[2]))
                    .prop("#size-cells", cells(&[1]))
                    .child(TestNode::new("fw@0").prop("reg", cells(&[0, 0x5000_0000, 0x2000]))),
            );
        let dtb = blob(&root, &[(0x4000_0000, 0x1000), (0x4800_0000, 0x3000)]);
        let mut seen = Vec::new();
        for_each_reservation(&dtb, |a, s| seen.push((a.get(), s))).unwrap();
        assert_eq!(
            seen,
            [
                (0x4000_0000, 0x1000),
                (0x4800_0000, 0x3000),
                (0x5000_0000, 0x2000)
            ]
        );
    }

    /// A small xorshift generator, so the test needs no dependency.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    #[test]
    fn never_panics_on_mutated_trees() {
        let seeds = [
            amd(),
            machine(
                &[(Some(0), G, G), (Some(1), 2 * G, G)],
                &[Some(0), Some(2), None],
                Some(&[(0, 1, 15)]),
                Some("x"),
            ),
        ];
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut o = Out::new(8, 8, 8);
        let rounds = if cfg!(miri) { 50 } else { 20_000 };
        for round in 0..rounds {
            let mut dtb = seeds[round % seeds.len()].clone();
            let len = dtb.len();
            match rng.next() % 4 {
                0 => {
                    // Flip bytes.
                    for _ in 0..1 + rng.next() % 4 {
                        let i = (rng.next() % len as u64) as usize;
                        dtb[i] = rng.next() as u8;
                    }
                }
                1 => {
                    // Overwrite a word with a token or a small or huge value.
                    let i = (rng.next() % (len as u64 / 4)) as usize * 4;
                    let w: u32 = [1, 2, 3, 4, 9, 0, 0xffff_ffff, 0x8000_0000, 12, 17]
                        [(rng.next() % 10) as usize];
                    dtb[i..i + 4].copy_from_slice(&w.to_be_bytes());
                }
                2 => {
                    // Truncate, keeping or fixing up totalsize.
                    let cut = (rng.next() % len as u64) as usize;
                    dtb.truncate(cut);
                    if rng.next().is_multiple_of(2) && cut >= 8 {
                        dtb[4..8].copy_from_slice(&(cut as u32).to_be_bytes());
                    }
                }
                _ => {
                    // Shrink or grow a header block size.
                    let field = [8usize, 12, 16, 32, 36][(rng.next() % 5) as usize];
                    let w = (rng.next() % (len as u64 + 64)) as u32;
                    dtb[field..field + 4].copy_from_slice(&w.to_be_bytes());
                }
            }
            let _ = parse(&dtb, &mut o.topo());
            let _ = for_each_reservation(&dtb, |_, _| {});
            let _ = string_property(&dtb, "/psci", "method");
        }
    }
}
