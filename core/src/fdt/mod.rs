//! NUMA topology from a flattened device tree (feature `fdt`).
//!
//! [`parse`] reads what Linux's `drivers/of/of_numa.c` reads and writes it into caller-provided
//! storage ([`FdtTopology`]), without a heap:
//!
//! - memory nodes (`device_type = "memory"`, children of the root) with `reg` and
//!   `numa-node-id`; the memory of an enabled one is the ranges of its `linux,usable-memory`
//!   if it has one, else of its `reg` (Linux's `early_init_dt_scan_memory`), less what
//!   `/chosen`'s `linux,usable-memory-range` (a kdump kernel's) leaves out: memory outside its
//!   first range, unless that is also in its second (Linux's
//!   `early_init_dt_check_for_usable_mem_range`; where the second names memory no memory node
//!   has, Linux adds it and numaframe, which cannot tell its node, does not);
//! - CPU nodes (children of `/cpus` named `cpu` or with `device_type = "cpu"`, a `"disabled"`
//!   one included, a `"fail"` one not, as Linux's `for_each_of_cpu_node`) with `numa-node-id`;
//!   `/cpus` is the first child of the root named exactly `cpus`, whatever its status, as
//!   Linux's `of_find_node_by_path` finds it (a `cpus@0` is not it);
//! - the distance map (the first node of the tree with `compatible = "numa-distance-map-v1"`,
//!   at any depth and whatever its `status`, as Linux's `of_find_compatible_node`), whose
//!   `distance-matrix` holds `(from, to, distance)` triples;
//! - `/chosen/bootargs`, from the first child of the root named `chosen` (with or without a
//!   unit address) whatever its status, as Linux's `early_init_dt_scan_chosen` finds it with
//!   `fdt_path_offset`, and read as it copies it: an empty value is no command line, and the
//!   command line is the value's bytes before its first NUL (all but its last byte without one).
//!
//! The rules follow Linux's:
//! - Without a distance map every distance is Linux's default: 10 local, 20 remote. A triple
//!   `(a, b, d)` sets `dist(a, b)`, and when `b > a` also `dist(b, a)` (a later `(b, a, d')`
//!   triple overrides it), so a one-sided matrix describes a symmetric machine.
//! - A CPU without `numa-node-id` takes that of `/cpus`, or else that of the root (Linux's
//!   `of_node_to_nid` walks up while the property is absent), if Linux finds that node
//!   possible: named by a memory node (whatever its `status`), by a CPU's own `numa-node-id` or
//!   first in a distance triple. Otherwise, or without one up there either, it belongs to node 0
//!   (`early_map_cpu_to_node`).
//! - A tree whose memory nodes carry no `numa-node-id` describes a machine without NUMA: one node
//!   0 with all memory and CPUs, whatever CPUs and distance map say (Linux's `dummy_numa_init`).
//! - Memory ranges are rounded inwards to whole 4 KiB frames; a range that holds no whole frame
//!   is dropped.
//!
//! The node count is one more than the largest node id named by a memory node (whatever its
//! `status`), a CPU's node or the distance map. Node states are explicit: a node has memory if a memory range names it, and
//! CPUs if a CPU does.
//!
//! # Where Linux is lenient and numaframe is not
//! Linux falls back to one node when a memory node lacks `numa-node-id` while others carry one,
//! and ignores a distance above 255 with a warning. [`parse`] returns a typed [`FdtError`] for
//! both instead: a half-described machine is a firmware bug worth seeing. Likewise a node below
//! the root with an empty name, which Linux reads like any other and the devicetree
//! specification forbids, is [`Malformed::UnnamedNode`]. And on a NUMA machine a CPU's
//! `numa-node-id` that is not one cell or names node [`MAX_NODES`](crate::MAX_NODES)
//! or more (its own, or that of `/cpus` or the root that it looks up to) is a typed error, where
//! Linux puts the CPU on node 0 (reading a longer value by its first cell). A command line
//! that is not UTF-8 is [`FdtError::BadProperty`], and one longer than Linux's
//! `COMMAND_LINE_SIZE` (2,048 bytes on arm64) is kept whole, where Linux copies its bytes and
//! cuts it there.
//!
//! # Malformed input
//! [`parse`] never panics, whatever the bytes: it checks the header and block bounds itself,
//! then reads the structure block with the `fdt` crate's fallible (`NoPanic`) parser, and decodes
//! every property value it uses with bounds checks. Errors carry the byte offset in the tree.
//!
//! ```
//! use numaframe::fdt::{FdtTopology, parse};
//! use numaframe::{NodeId, NodeInfo, MemoryRange};
//! # fn tree() -> &'static [u8] { include_bytes!("../../testdata/qemu-virt-2node.dtb") }
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

mod cpus;
mod distance;
mod error;
mod header;
mod lookup;
mod memory;
mod output;
mod parse;
mod reservations;
#[cfg(test)]
mod test_tree;
mod tree;
mod value;

pub use self::distance::REMOTE_DISTANCE;
pub use self::error::{Block, FdtError, Malformed, Table};
pub use self::lookup::string_property;
pub use self::output::{FdtInfo, FdtTopology};
pub use self::parse::parse;
pub use self::reservations::for_each_reservation;

#[cfg(test)]
mod tests {
    use super::test_tree::{G, Out, amd, machine};
    use super::*;

    use numaframe_testkit_base::Rng;

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
        let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
        let mut o = Out::new(8, 8, 8);
        let rounds = if cfg!(miri) { 50 } else { 20_000 };
        for round in 0..rounds {
            let mut dtb = seeds[round % seeds.len()].clone();
            let len = dtb.len();
            match rng.next_u64() % 4 {
                0 => {
                    // Flip bytes.
                    for _ in 0..1 + rng.next_u64() % 4 {
                        let i = (rng.next_u64() % len as u64) as usize;
                        dtb[i] = rng.next_u64() as u8;
                    }
                }
                1 => {
                    // Overwrite a word with a token or a small or huge value.
                    let i = (rng.next_u64() % (len as u64 / 4)) as usize * 4;
                    let w: u32 = [1, 2, 3, 4, 9, 0, 0xffff_ffff, 0x8000_0000, 12, 17]
                        [(rng.next_u64() % 10) as usize];
                    dtb[i..i + 4].copy_from_slice(&w.to_be_bytes());
                }
                2 => {
                    // Truncate, keeping or fixing up totalsize.
                    let cut = (rng.next_u64() % len as u64) as usize;
                    dtb.truncate(cut);
                    if rng.next_u64().is_multiple_of(2) && cut >= 8 {
                        dtb[4..8].copy_from_slice(&(cut as u32).to_be_bytes());
                    }
                }
                _ => {
                    // Shrink or grow a header block size.
                    let field = [8usize, 12, 16, 32, 36][(rng.next_u64() % 5) as usize];
                    let w = (rng.next_u64() % (len as u64 + 64)) as u32;
                    dtb[field..field + 4].copy_from_slice(&w.to_be_bytes());
                }
            }
            let _ = parse(&dtb, &mut o.topo());
            let _ = for_each_reservation(&dtb, |_, _| {});
            let _ = string_property(&dtb, "/psci", "method");
        }
    }
}
