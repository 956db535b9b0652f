//! The errors of the device-tree reader: what is wrong with a tree, and where.
#![deny(unsafe_code)]

use core::fmt;

use crate::topology::MAX_NODES;

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
    /// A node other than the root with an empty name (the devicetree specification gives every
    /// other node a name of at least one character).
    UnnamedNode,
    /// Any other complaint of the parser.
    Other,
}

/// Which caller-provided table of an [`FdtTopology`](super::FdtTopology) was too small.
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

/// A device tree that [`parse`](super::parse) cannot use. Offsets are bytes from the start of
/// the tree.
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
            Malformed::UnnamedNode => "a node other than the root has an empty name",
            Malformed::Other => "malformed structure",
        })
    }
}

impl FdtError {
    /// The byte of the input the error points at, for the errors that name one: always inside
    /// the input given to the reader.
    pub fn offset(&self) -> Option<usize> {
        match *self {
            FdtError::Malformed { at, .. }
            | FdtError::BadProperty { at, .. }
            | FdtError::BadCells { at, .. }
            | FdtError::NodeIdOutOfRange { at, .. }
            | FdtError::MissingNodeId { at }
            | FdtError::BadDistance { at, .. }
            | FdtError::BadRange { at, .. } => Some(at),
            _ => None,
        }
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
