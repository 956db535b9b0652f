//! Linux's rules for the NUMA layout that ACPI describes, over SRAT and SLIT entries that the
//! `acpi` crate has already decoded (`drivers/acpi/numa/srat.c`, `arch/x86/mm/srat.c`):
//!
//! - **Node numbers** are not proximity domains: the first proximity domain Linux meets gets
//!   node 0, the next new one node 1, and so on (`acpi_map_pxm_to_node`). It reads the SRAT
//!   twice: first every processor-affinity entry (xAPIC and x2APIC, in table order), then every
//!   memory-affinity entry. Generic initiator entries are numbered in the first pass, with
//!   the processors. Disabled entries are skipped before their domain is numbered, but a
//!   disabled generic initiator ends the first pass (its handler fails, and Linux's walk calls
//!   no handler after a failed one). An SRAT of revision 1 or older names a domain with its
//!   low 8 bits only. A processor or memory
//!   entry of a domain of `MAX_PXM_DOMAINS` (1024) or more gets no node, and Linux then uses no
//!   part of the SRAT (`bad_srat`): [`SratError::NotUsed`]; so does a processor or memory
//!   entry of the wrong length. Nor does it use an SRAT with a subtable of length 0, where its
//!   walk of the subtables fails.
//! - **Distances** come from the SLIT, indexed by proximity domain: `dist(a, b)` is the entry
//!   of `(pxm(a), pxm(b))` when both lie inside the table, else 10 on the diagonal and 20
//!   elsewhere. A SLIT with a diagonal other than 10 or a remote distance of 10 or less is
//!   rejected whole ("SLIT table looks invalid. Not used."), and every distance is then 10/20.
//!
//! What it prints are Linux's lines for the same tables: the memory lines as Linux's default
//! boot log has them (a test compares them with Linux's), the processor lines in the format of
//! Linux's debug-level message.
//!
//! [`entries`] decodes the SRAT's subtables from the table's bytes. The `acpi` crate finds and
//! maps the table, but its own SRAT entry iterator reads a subtable's one-byte length as two
//! bytes (its `EntryHeader` has a `u16` length), so every entry it yields is misread.

use core::fmt::{self, Write};

use numaframe::topology::valid_firmware_distance;
use numaframe::{MemoryRange, NodeId, PAGE_SIZE, Pfn, PhysRange};

use crate::boot::{MAX_CPUS, MAX_NODES, MAX_RANGES};

/// Linux's `MAX_PXM_DOMAINS`: `MAX_NUMNODES` when that is above 256, as numaframe's 1024 node
/// ids are (`CONFIG_NODES_SHIFT=10`). Linux gives no node to a larger domain.
const MAX_PXM_DOMAINS: u32 = numaframe::MAX_NODES as u32;

/// Linux's `LOCAL_DISTANCE` and `REMOTE_DISTANCE`.
const LOCAL: u8 = 10;
const REMOTE: u8 = 20;

/// One SRAT entry, as far as NUMA numbering cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    /// A processor: local APIC (`x2apic: false`) or local x2APIC affinity.
    Cpu {
        /// The APIC id.
        apic: u32,
        /// An x2APIC entry.
        x2apic: bool,
        /// The proximity domain as the entry holds it (all 32 bits).
        pxm: u32,
        /// The entry's enabled flag.
        enabled: bool,
    },
    /// A generic initiator (a device that starts memory accesses, such as an accelerator).
    Initiator {
        /// The proximity domain (all 32 bits).
        pxm: u32,
        /// The entry's enabled flag.
        enabled: bool,
    },
    /// A memory range.
    Memory {
        /// First byte.
        base: u64,
        /// Bytes.
        length: u64,
        /// The proximity domain.
        pxm: u32,
        /// The entry's enabled flag.
        enabled: bool,
        /// The hot-pluggable flag.
        hotplug: bool,
        /// The non-volatile flag.
        nonvolatile: bool,
    },
    /// A subtable of length 0, where Linux's walk of the subtables fails; the last entry.
    ZeroLength,
    /// A local APIC (type 0), memory (1) or x2APIC (2) affinity entry of a length Linux
    /// refuses the SRAT for: not 16, under 40, under 24.
    BadLength {
        /// The subtable's type.
        kind: u8,
    },
}

/// Bytes of an SRAT before its first subtable: the common table header and 12 reserved bytes.
pub const SRAT_HEADER: usize = 48;

fn le32(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .map_or(0, |w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
}

/// The processor and memory entries of the SRAT `table` (its whole bytes, header included),
/// in table order. The walk stops at a subtable that runs past the table, and at one of length 0,
/// which it yields as [`Entry::ZeroLength`] when Linux's walk would read it (a byte follows its
/// header); an affinity entry of a length Linux refuses is [`Entry::BadLength`], a generic
/// initiator shorter than its layout is skipped, other types too.
pub fn entries(table: &[u8]) -> impl Iterator<Item = Entry> + '_ {
    let mut at = SRAT_HEADER;
    core::iter::from_fn(move || {
        loop {
            let (kind, len) = (*table.get(at)?, usize::from(*table.get(at + 1)?));
            if len == 0 {
                // `acpi_parse_entries_array` reads a header while `entry + 2 < table_end`.
                let read = at + 2 < table.len();
                at = table.len();
                return read.then_some(Entry::ZeroLength);
            }
            let e = table.get(at..at.checked_add(len)?).filter(|_| len > 0)?;
            at += len;
            match (kind, len) {
                (0, 16) => {
                    return Some(Entry::Cpu {
                        apic: u32::from(e[3]),
                        x2apic: false,
                        pxm: u32::from(e[2]) | (u32::from_le_bytes([e[9], e[10], e[11], 0]) << 8),
                        enabled: le32(e, 4) & 1 != 0,
                    });
                }
                (1, 40..) => {
                    let flags = le32(e, 28);
                    return Some(Entry::Memory {
                        base: u64::from(le32(e, 8)) | (u64::from(le32(e, 12)) << 32),
                        length: u64::from(le32(e, 16)) | (u64::from(le32(e, 20)) << 32),
                        pxm: le32(e, 2),
                        enabled: flags & 1 != 0,
                        hotplug: flags & 2 != 0,
                        nonvolatile: flags & 4 != 0,
                    });
                }
                (5, 32..) => {
                    return Some(Entry::Initiator {
                        pxm: le32(e, 4),
                        enabled: le32(e, 24) & 1 != 0,
                    });
                }
                (2, 24..) => {
                    return Some(Entry::Cpu {
                        apic: le32(e, 8),
                        x2apic: true,
                        pxm: le32(e, 4),
                        enabled: le32(e, 12) & 1 != 0,
                    });
                }
                (0..=2, _) => return Some(Entry::BadLength { kind }),
                _ => {}
            }
        }
    })
}

/// Whether Linux starts the processor of a MADT local APIC (`x2apic: false`) or local x2APIC
/// entry with `flags` at boot (`acpi_parse_lapic`, `acpi_parse_x2apic`): one with the invalid
/// id (0xff, 0xffffffff) is ignored, and only an enabled one (flag bit 0) is started; one that
/// is only "online capable" (bit 1) is a hot-plug slot.
pub fn madt_starts(apic: u32, x2apic: bool, flags: u32) -> bool {
    let invalid = if x2apic { u32::MAX } else { 0xff };
    apic != invalid && flags & 1 != 0
}

/// Tables that do not fit this kernel's storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SratError {
    /// More proximity domains than [`MAX_NODES`]; the first one left out.
    TooManyDomains(u32),
    /// More enabled processors than [`MAX_CPUS`].
    TooManyCpus,
    /// More memory ranges than [`MAX_RANGES`].
    TooManyRanges,
    /// Writing to the console failed.
    Console,
    /// Linux would not use this SRAT (`bad_srat()`, or a walk of its subtables that failed):
    /// the machine boots as one without NUMA.
    NotUsed,
}

impl fmt::Display for SratError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SratError::TooManyDomains(pxm) => {
                write!(
                    f,
                    "SRAT: more than {MAX_NODES} proximity domains (PXM {pxm})"
                )
            }
            SratError::TooManyCpus => write!(f, "SRAT: more than {MAX_CPUS} processors"),
            SratError::TooManyRanges => write!(f, "SRAT: more than {MAX_RANGES} memory ranges"),
            SratError::Console => f.write_str("console write failed"),
            SratError::NotUsed => f.write_str("SRAT: not used"),
        }
    }
}

impl From<fmt::Error> for SratError {
    fn from(_: fmt::Error) -> Self {
        SratError::Console
    }
}

/// Linux's `bad_srat()`: prints its line and gives up the SRAT. A console that fails is lost
/// in the refusal.
fn bad_srat(out: &mut dyn Write) -> SratError {
    let _ = writeln!(out, "ACPI: SRAT: SRAT not used.");
    SratError::NotUsed
}

/// Why [`Layout::memory`] gives no ranges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryError {
    /// More ranges than the output holds.
    TooMany,
    /// Ranges of two nodes overlap: Linux does not use the SRAT (`numa_cleanup_meminfo`).
    Overlap,
}

/// The machine an SRAT describes, numbered as Linux numbers it.
#[derive(Clone, Debug)]
pub struct Layout {
    /// The proximity domain of each node.
    pxms: [u32; MAX_NODES],
    nodes: usize,
    /// APIC id and node of each enabled processor, in SRAT order (the machine's CPU order).
    cpus: [(u32, NodeId); MAX_CPUS],
    ncpus: usize,
    /// The enabled memory ranges in bytes, with their node.
    memory: [(u64, u64, NodeId); MAX_RANGES],
    nmemory: usize,
}

impl Layout {
    /// Reads the entries of an SRAT of `revision` (each call of `entries` yields them in table
    /// order; it is called twice), printing Linux's lines for each entry it keeps.
    ///
    /// # Errors
    /// An [`SratError`] when the tables exceed this kernel's storage.
    pub fn from_srat<I: Iterator<Item = Entry>>(
        revision: u8,
        entries: impl Fn() -> I,
        out: &mut dyn Write,
    ) -> Result<Layout, SratError> {
        let mut l = Layout {
            pxms: [0; MAX_NODES],
            nodes: 0,
            cpus: [(0, NodeId::new(0)); MAX_CPUS],
            ncpus: 0,
            memory: [(0, 0, NodeId::new(0)); MAX_RANGES],
            nmemory: 0,
        };
        let narrow = |pxm: u32| if revision <= 1 { pxm & 0xff } else { pxm };
        for e in entries() {
            // The first pass fails there (its result is not looked at).
            if e == Entry::ZeroLength {
                break;
            }
            if let Entry::BadLength { kind: 0 | 2 } = e {
                return Err(bad_srat(out));
            }
            // A generic initiator's domain is numbered in this pass too, in table order
            // (`acpi_parse_gi_affinity`), with all 32 bits at every revision. A disabled one,
            // or one whose domain gets no node, fails, and Linux's walk reads nothing more in
            // this pass.
            if let Entry::Initiator { pxm, enabled } = e
                && (!enabled || l.map(pxm)?.is_none())
            {
                break;
            }
            if let Entry::Cpu {
                apic,
                x2apic,
                pxm,
                enabled: true,
            } = e
            {
                // x2APIC entries always carry all 32 bits of their domain.
                let pxm = if x2apic { pxm } else { narrow(pxm) };
                let node = l.map(pxm)?.ok_or_else(|| bad_srat(out))?;
                let slot = l.cpus.get_mut(l.ncpus).ok_or(SratError::TooManyCpus)?;
                *slot = (apic, node);
                l.ncpus += 1;
                if x2apic {
                    writeln!(out, "SRAT: PXM {pxm} -> APIC {apic:#06x} -> Node {node}")?;
                } else {
                    writeln!(out, "SRAT: PXM {pxm} -> APIC {apic:#04x} -> Node {node}")?;
                }
            }
        }
        for e in entries() {
            // The memory pass fails there, and so does `acpi_numa_init`.
            if e == Entry::ZeroLength {
                return Err(SratError::NotUsed);
            }
            if let Entry::BadLength { kind: 1 } = e {
                return Err(bad_srat(out));
            }
            if let Entry::Memory {
                base,
                length,
                pxm,
                enabled: true,
                hotplug,
                nonvolatile,
            } = e
            {
                let pxm = narrow(pxm);
                let node = l.map(pxm)?.ok_or_else(|| bad_srat(out))?;
                let slot = l
                    .memory
                    .get_mut(l.nmemory)
                    .ok_or(SratError::TooManyRanges)?;
                *slot = (base, length, node);
                l.nmemory += 1;
                writeln!(
                    out,
                    "ACPI: SRAT: Node {node} PXM {pxm} [mem {base:#010x}-{:#010x}]{}{}",
                    base.wrapping_add(length).wrapping_sub(1),
                    if hotplug { " hotplug" } else { "" },
                    if nonvolatile { " non-volatile" } else { "" },
                )?;
            }
        }
        Ok(l)
    }

    /// The node of `pxm`, numbering it if it is new (`acpi_map_pxm_to_node`); `None` for a
    /// domain Linux gives no node (`NUMA_NO_NODE`: `MAX_PXM_DOMAINS` or more).
    fn map(&mut self, pxm: u32) -> Result<Option<NodeId>, SratError> {
        if pxm >= MAX_PXM_DOMAINS {
            return Ok(None);
        }
        if let Some(i) = self.pxms[..self.nodes].iter().position(|p| *p == pxm) {
            return Ok(Some(NodeId::new(i)));
        }
        let slot = self
            .pxms
            .get_mut(self.nodes)
            .ok_or(SratError::TooManyDomains(pxm))?;
        *slot = pxm;
        self.nodes += 1;
        Ok(Some(NodeId::new(self.nodes - 1)))
    }

    /// Nodes: every proximity domain an enabled entry named.
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// The proximity domain of `node`.
    #[cfg(test)]
    fn pxm(&self, node: NodeId) -> Option<u32> {
        self.pxms[..self.nodes].get(node.index()).copied()
    }

    /// APIC id and node of each enabled processor, in SRAT order.
    pub fn cpus(&self) -> &[(u32, NodeId)] {
        &self.cpus[..self.ncpus]
    }

    /// Writes the node distances (`out[a * nodes + b]`) from a SLIT of `localities` domains
    /// whose entry `(i, j)` is `slit[i * localities + j]`, or Linux's defaults without one.
    /// Returns `false` (after printing Linux's line) when the SLIT was rejected.
    ///
    /// # Errors
    /// [`SratError::Console`] if printing fails.
    pub fn distances(
        &self,
        slit: Option<(&[u8], usize)>,
        out: &mut [u8],
        log: &mut dyn Write,
    ) -> Result<bool, SratError> {
        let n = self.nodes;
        for (i, d) in out.iter_mut().take(n * n).enumerate() {
            *d = if i / n == i % n { LOCAL } else { REMOTE };
        }
        let Some((table, count)) = slit else {
            return Ok(true);
        };
        let at = |i: usize, j: usize| {
            i.checked_mul(count)
                .and_then(|k| k.checked_add(j))
                .and_then(|k| table.get(k).copied())
        };
        let valid = (0..count).all(|i| {
            (0..count).all(|j| {
                // The rule needs only whether the entry is on the diagonal, not node ids: a
                // SLIT may have more localities than there are node ids.
                let (a, b) = (NodeId::new(0), NodeId::new(usize::from(i != j)));
                at(i, j).is_some_and(|d| valid_firmware_distance(a, b, d))
            })
        });
        if !valid {
            writeln!(log, "ACPI: SLIT table looks invalid. Not used.")?;
            return Ok(false);
        }
        for a in 0..n {
            for b in 0..n {
                let (pa, pb) = (self.pxms[a] as usize, self.pxms[b] as usize);
                if pa < count
                    && pb < count
                    && let (Some(d), Some(slot)) = (at(pa, pb), out.get_mut(a * n + b))
                {
                    *slot = d;
                }
            }
        }
        Ok(true)
    }

    /// Writes the parts of the RAM ranges `ram` (bytes: base, length) that the SRAT's memory
    /// ranges cover, as whole frames with their node, into `out`, after x86's
    /// `numa_cleanup_meminfo`: a range of length 0 or past the top of the address space is
    /// dropped (`numa_add_memblk`), one that overlaps no RAM is set aside and the others are
    /// cut to the span of RAM; two of different nodes that overlap are refused; two of one
    /// node are joined, with the hole between them, when that overlaps no other node's range.
    /// Returns how many it wrote.
    ///
    /// # Errors
    /// [`MemoryError::Overlap`] for ranges of two nodes that overlap (Linux then does not use
    /// the SRAT), [`MemoryError::TooMany`] if `out` is too small.
    pub fn memory(
        &self,
        ram: &[(u64, u64)],
        out: &mut [MemoryRange],
    ) -> Result<usize, MemoryError> {
        let has_ram = |start: u64, end: u64| {
            ram.iter()
                .any(|&(b, l)| l > 0 && b < end && start < b.saturating_add(l))
        };
        let low = ram.iter().map(|r| r.0).min().unwrap_or(0);
        let high = ram
            .iter()
            .map(|r| r.0.saturating_add(r.1))
            .max()
            .unwrap_or(0);
        let mut blk = [(0, 0, NodeId::new(0)); MAX_RANGES];
        let mut nr = 0;
        for &(base, len, node) in &self.memory[..self.nmemory] {
            let Some(end) = base.checked_add(len).filter(|_| len > 0) else {
                continue;
            };
            if !has_ram(base, end) {
                continue;
            }
            let (start, end) = (base.max(low), end.min(high));
            if start < end {
                blk[nr] = (start, end, node);
                nr += 1;
            }
        }
        let mut i = 0;
        while i < nr {
            let mut j = i + 1;
            while j < nr {
                let ((si, ei, ni), (sj, ej, nj)) = (blk[i], blk[j]);
                if ni != nj {
                    if ei > sj && si < ej {
                        return Err(MemoryError::Overlap);
                    }
                    j += 1;
                    continue;
                }
                let (start, end) = (si.min(sj), ei.max(ej));
                if blk[..nr]
                    .iter()
                    .any(|&(s, e, n)| n != ni && start < e && end > s)
                {
                    j += 1;
                    continue;
                }
                blk[i] = (start, end, ni);
                blk.copy_within(j + 1..nr, j);
                nr -= 1;
            }
            i += 1;
        }
        let mut n = 0;
        for &(base, len) in ram {
            for &(mbase, mend, node) in &blk[..nr] {
                let start = base.max(mbase);
                let end = base.saturating_add(len).min(mend);
                let (first, last) = (start.div_ceil(PAGE_SIZE), end / PAGE_SIZE);
                if first >= last {
                    continue;
                }
                let range =
                    PhysRange::new(Pfn::new(first), Pfn::new(last)).ok_or(MemoryError::TooMany)?;
                *out.get_mut(n).ok_or(MemoryError::TooMany)? = MemoryRange { node, range };
                n += 1;
            }
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes of an SRAT whose entries are an enabled local APIC affinity entry (APIC 0 in
    /// PXM 0) and an enabled memory affinity entry (`length` bytes from 0 in PXM `pxm`).
    fn cpu_and_memory_table(pxm: u8, length: u64) -> Vec<u8> {
        let mut t = vec![0u8; SRAT_HEADER];
        t.extend([0, 16, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        t.extend([1, 40, pxm, 0, 0, 0, 0, 0]);
        t.extend(0u64.to_le_bytes());
        t.extend(length.to_le_bytes());
        t.extend([0, 0, 0, 0, 1, 0, 0, 0]);
        t.extend([0; 8]);
        t
    }

    fn cpu(apic: u32, pxm: u32) -> Entry {
        Entry::Cpu {
            apic,
            x2apic: false,
            pxm,
            enabled: true,
        }
    }

    fn mem(base: u64, length: u64, pxm: u32, enabled: bool) -> Entry {
        Entry::Memory {
            base,
            length,
            pxm,
            enabled,
            hotplug: false,
            nonvolatile: false,
        }
    }

    /// QEMU's tables for a machine whose node 0 has memory but no CPU: Linux names the
    /// processors' domains first.
    #[test]
    fn processor_domains_are_numbered_before_memory_domains() {
        let entries = [
            cpu(0, 1),
            cpu(1, 2),
            Entry::Cpu {
                apic: 2,
                x2apic: false,
                pxm: 0x0102,
                enabled: true,
            },
            Entry::Cpu {
                apic: 3,
                x2apic: false,
                pxm: 0,
                enabled: false,
            },
            mem(0, 0xa_0000, 0, true),
            mem(0x10_0000, 0x3ff0_0000, 0, true),
            mem(0x4000_0000, 0x4000_0000, 1, true),
            mem(0x1_0000_0000, 0x4000_0000, 2, true),
            mem(0, 0, 0, false),
        ];
        let mut log = String::new();
        let l = Layout::from_srat(1, || entries.iter().copied(), &mut log).unwrap();
        assert_eq!(l.nodes(), 3);
        assert_eq!(
            [0, 1, 2].map(|n| l.pxm(NodeId::new(n)).unwrap()),
            [1, 2, 0],
            "a revision-1 SRAT keeps the low 8 bits (0x0102 is domain 2)"
        );
        assert_eq!(
            l.cpus(),
            &[
                (0, NodeId::new(0)),
                (1, NodeId::new(1)),
                (2, NodeId::new(1))
            ]
        );
        assert_eq!(
            log,
            "SRAT: PXM 1 -> APIC 0x00 -> Node 0\n\
             SRAT: PXM 2 -> APIC 0x01 -> Node 1\n\
             SRAT: PXM 2 -> APIC 0x02 -> Node 1\n\
             ACPI: SRAT: Node 2 PXM 0 [mem 0x00000000-0x0009ffff]\n\
             ACPI: SRAT: Node 2 PXM 0 [mem 0x00100000-0x3fffffff]\n\
             ACPI: SRAT: Node 0 PXM 1 [mem 0x40000000-0x7fffffff]\n\
             ACPI: SRAT: Node 1 PXM 2 [mem 0x100000000-0x13fffffff]\n"
        );
        let l2 = Layout::from_srat(2, || entries.iter().copied(), &mut String::new()).unwrap();
        assert_eq!(
            l2.pxm(NodeId::new(2)),
            Some(0x102),
            "revision 2 keeps all bits"
        );

        // Distances follow the domains: node 0 is PXM 1, node 2 is PXM 0.
        let slit = [10, 21, 31, 21, 10, 41, 31, 41, 10];
        let mut d = [0; 9];
        assert!(l.distances(Some((&slit, 3)), &mut d, &mut log).unwrap());
        assert_eq!(d, [10, 41, 21, 41, 10, 31, 21, 31, 10]);

        // RAM inside the SRAT ranges, cut to whole frames; RAM outside them is dropped.
        let ram = [
            (0, 0x9_fc00),
            (0x10_0000, 0x7ff0_0000),
            (0x1_0000_0000, 0x4000_0000),
        ];
        let mut out = [MemoryRange {
            node: NodeId::new(0),
            range: PhysRange::default(),
        }; 8];
        let n = l.memory(&ram, &mut out).unwrap();
        let got: Vec<(usize, u64, u64)> = out[..n]
            .iter()
            .map(|r| (r.node.index(), r.range.start().get(), r.range.end().get()))
            .collect();
        assert_eq!(
            got,
            [
                (2, 0, 0x9f),
                (2, 0x100, 0x4_0000),
                (0, 0x4_0000, 0x8_0000),
                (1, 0x10_0000, 0x14_0000)
            ]
        );
    }

    /// The RAM each node gets from `memory`, as (node, first frame, end frame).
    fn frames(l: &Layout, ram: &[(u64, u64)]) -> Result<Vec<(usize, u64, u64)>, MemoryError> {
        let mut out = [MemoryRange {
            node: NodeId::new(0),
            range: PhysRange::default(),
        }; 16];
        let n = l.memory(ram, &mut out)?;
        Ok(out[..n]
            .iter()
            .map(|r| (r.node.index(), r.range.start().get(), r.range.end().get()))
            .collect())
    }

    const GIB: u64 = 1 << 30;
    const GIB_FRAMES: u64 = GIB / PAGE_SIZE;

    /// x86's `numa_cleanup_meminfo` sets aside the SRAT ranges that overlap no RAM, then looks
    /// at every pair of the others: two of different nodes that overlap make it fail ("node %d
    /// [mem ...] overlaps with node %d [mem ...]"), and `numa_init` with it, so Linux boots
    /// without NUMA; two of one node that overlap are only warned about, and joined.
    #[test]
    fn overlapping_memory_is_refused_across_nodes_and_joined_within_one() {
        let layout = |m: &[Entry]| {
            let e: Vec<Entry> = [cpu(0, 0), cpu(1, 1)].iter().chain(m).copied().collect();
            Layout::from_srat(3, || e.clone().into_iter(), &mut String::new()).unwrap()
        };
        let ram = [(0, 4 * GIB)];
        let l = layout(&[mem(0, 2 * GIB, 0, true), mem(GIB, 2 * GIB, 1, true)]);
        assert_eq!(frames(&l, &ram), Err(MemoryError::Overlap));
        let l = layout(&[
            mem(0, 2 * GIB, 0, true),
            mem(GIB, 2 * GIB, 0, true),
            mem(3 * GIB, GIB, 1, true),
        ]);
        assert_eq!(
            frames(&l, &ram),
            Ok(vec![
                (0, 0, 3 * GIB_FRAMES),
                (1, 3 * GIB_FRAMES, 4 * GIB_FRAMES)
            ]),
            "each frame once"
        );
        // Ranges without RAM (hot-pluggable memory above it) are set aside before the check.
        let l = layout(&[
            mem(0, 4 * GIB, 0, true),
            mem(8 * GIB, 2 * GIB, 0, true),
            mem(9 * GIB, 2 * GIB, 1, true),
        ]);
        assert_eq!(frames(&l, &ram), Ok(vec![(0, 0, 4 * GIB_FRAMES)]));
    }

    /// `numa_cleanup_meminfo` joins two ranges of one node, and the hole between them, when that
    /// joined range overlaps no range of another node; `numa_register_memblks` then gives all
    /// RAM inside it to the node (`memblock_set_node`), the hole's RAM too.
    #[test]
    fn ram_in_a_hole_between_one_node_ranges_is_on_that_node() {
        let e = [
            cpu(0, 0),
            cpu(1, 1),
            mem(0, GIB, 0, true),
            mem(2 * GIB, GIB, 0, true),
            mem(3 * GIB, GIB, 1, true),
        ];
        let l = Layout::from_srat(3, || e.into_iter(), &mut String::new()).unwrap();
        assert_eq!(
            frames(&l, &[(0, 4 * GIB)]),
            Ok(vec![
                (0, 0, 3 * GIB_FRAMES),
                (1, 3 * GIB_FRAMES, 4 * GIB_FRAMES)
            ])
        );
        // With node 1's range inside the hole, node 0's two are not joined.
        let e = [
            cpu(0, 0),
            cpu(1, 1),
            mem(0, GIB, 0, true),
            mem(2 * GIB, GIB, 0, true),
            mem(GIB + GIB / 2, GIB / 4, 1, true),
        ];
        let l = Layout::from_srat(3, || e.into_iter(), &mut String::new()).unwrap();
        assert_eq!(
            frames(&l, &[(0, 3 * GIB)]),
            Ok(vec![
                (0, 0, GIB_FRAMES),
                (0, 2 * GIB_FRAMES, 3 * GIB_FRAMES),
                (1, 3 * GIB_FRAMES / 2, 7 * GIB_FRAMES / 4)
            ])
        );
    }

    /// x86 Linux calls `bad_srat()`, and so uses no part of the SRAT, for a local APIC affinity
    /// entry whose length is not 16 (`acpi_numa_processor_affinity_init`: `!=`), an x2APIC
    /// affinity entry shorter than 24 (`acpi_numa_x2apic_affinity_init`) and a memory affinity
    /// entry shorter than 40 (`acpi_numa_memory_affinity_init`: "Unexpected header length"),
    /// before it looks at the enabled flag.
    #[test]
    fn an_affinity_entry_of_the_wrong_length_makes_linux_refuse_the_srat() {
        let table = |extra: &[u8]| {
            let mut t = cpu_and_memory_table(0, 1 << 30);
            t.extend(extra);
            t
        };
        let used = |t: &[u8]| Layout::from_srat(3, || entries(t), &mut String::new()).is_ok();
        assert!(used(&table(&[])));
        let mut apic20 = vec![0u8, 20, 0, 1];
        apic20.resize(20, 0);
        assert!(!used(&table(&apic20)), "local APIC, 20 bytes, disabled");
        let mut x2apic22 = vec![2u8, 22];
        x2apic22.resize(22, 0);
        assert!(!used(&table(&x2apic22)), "x2APIC, 22 bytes");
        let mut x2apic28 = vec![2u8, 28, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1];
        x2apic28.resize(28, 0);
        assert!(used(&table(&x2apic28)), "a longer x2APIC entry is read");
        let mut mem32 = vec![1u8, 32];
        mem32.resize(32, 0);
        assert!(!used(&table(&mem32)), "memory, 32 bytes");
    }

    /// `acpi_numa_memory_affinity_init` computes `end = start + length` in `u64` and prints
    /// `end - 1` as it comes out: a range of length 0 at 0 prints `0xffffffffffffffff`, one that
    /// runs past the top of the address space its wrapped end.
    #[test]
    fn memory_lines_print_the_end_as_linux_computes_it() {
        let mut log = String::new();
        let e = [
            cpu(0, 0),
            mem(0, 0, 0, true),
            mem(0x1000, u64::MAX, 0, true),
        ];
        Layout::from_srat(3, || e.into_iter(), &mut log).unwrap();
        let end = 0x1000u64.wrapping_add(u64::MAX).wrapping_sub(1);
        assert_eq!(
            log,
            format!(
                "SRAT: PXM 0 -> APIC 0x00 -> Node 0\n\
                 ACPI: SRAT: Node 0 PXM 0 [mem 0x00000000-0xffffffffffffffff]\n\
                 ACPI: SRAT: Node 0 PXM 0 [mem 0x00001000-{end:#010x}]\n"
            )
        );
    }

    /// Subtables as the ACPI specification lays them out, walked until a bad length.
    #[test]
    fn subtables_decode_from_their_bytes() {
        let mut t = vec![0u8; SRAT_HEADER];
        // Local APIC affinity: PXM 0x030201 (low byte and high bytes), APIC 7, enabled.
        t.extend([0, 16, 0x01, 7, 1, 0, 0, 0, 0, 0x02, 0x03, 0, 0, 0, 0, 0]);
        // A GICC affinity (type 3), skipped.
        t.extend([3, 18, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        // Memory affinity: PXM 5, base 0x1_0000_0000, length 0x2_4000_0000, enabled, hotplug.
        let mut m = vec![1, 40, 5, 0, 0, 0, 0, 0];
        m.extend([
            0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0x40, 2, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0,
        ]);
        m.extend([0; 8]);
        t.extend(&m);
        // x2APIC affinity: PXM 0x104, x2APIC 0x1234, disabled.
        t.extend([2, 24, 0, 0, 4, 1, 0, 0, 0x34, 0x12, 0, 0, 0, 0, 0, 0]);
        t.extend([0; 8]);
        let good = t.len();
        // A zero length ends the walk (Linux's fails there), and so does one past the end.
        t.extend([0, 0, 0, 0]);
        let all: Vec<Entry> = entries(&t).collect();
        let want = [
            Entry::Cpu {
                apic: 7,
                x2apic: false,
                pxm: 0x03_0201,
                enabled: true,
            },
            Entry::Memory {
                base: 0x1_0000_0000,
                length: 0x2_4000_0000,
                pxm: 5,
                enabled: true,
                hotplug: true,
                nonvolatile: false,
            },
            Entry::Cpu {
                apic: 0x1234,
                x2apic: true,
                pxm: 0x104,
                enabled: false,
            },
            Entry::ZeroLength,
        ];
        assert_eq!(all, want);
        t.truncate(good);
        t.extend([0, 16, 0, 0]);
        assert_eq!(
            entries(&t).count(),
            3,
            "a subtable past the end is not read"
        );
        assert_eq!(entries(&t[..10]).count(), 0);
    }

    /// Linux's first SRAT pass (`acpi_numa_init`) takes the generic initiator affinity
    /// entries (type 5) together with the processor entries, in table order: an enabled one
    /// numbers its domain (`acpi_parse_gi_affinity` maps the PXM and sets it in
    /// `numa_nodes_parsed`; x86's `init_gi_nodes` brings the node online), so that domain comes
    /// before every memory-only domain. A disabled one names nothing.
    #[test]
    fn generic_initiator_domains_are_numbered_with_the_processors() {
        // Local APIC affinity: APIC 0 in PXM 0; memory affinity: PXM 1, 256 MiB from 0.
        let mut t = cpu_and_memory_table(1, 256 << 20);
        // Generic initiator affinity: PCI handle type, PXM `pxm`, a 16-byte device handle,
        // flags, 4 reserved bytes.
        let gi = |pxm: u32, flags: u32| {
            let mut e = vec![5u8, 32, 0, 1];
            e.extend(pxm.to_le_bytes());
            e.extend([0; 16]);
            e.extend(flags.to_le_bytes());
            e.extend([0; 4]);
            e
        };
        t.extend(gi(2, 1));
        t.extend(gi(3, 0));
        let mut log = String::new();
        let l = Layout::from_srat(3, || entries(&t), &mut log).unwrap();
        // Pass 1: PXM 0 (processor) -> node 0, PXM 2 (initiator) -> node 1; pass 2: PXM 1
        // (memory) -> node 2. PXM 3 is disabled.
        assert_eq!(l.nodes(), 3, "{log}");
        assert_eq!(
            [0, 1, 2].map(|n| l.pxm(NodeId::new(n)).unwrap()),
            [0, 2, 1],
            "{log}"
        );
        assert!(
            log.contains("ACPI: SRAT: Node 2 PXM 1 [mem 0x00000000-0x0fffffff]\n"),
            "{log}"
        );
    }

    /// `acpi_parse_gi_affinity` returns `-EINVAL` for a disabled generic initiator entry (and
    /// for one whose domain gets no node), and after a handler's failure Linux's walk of the
    /// first pass calls no other handler (`acpi_parse_entries_array`: 6.1 skips every later
    /// handler once `errs` is set, 6.12 returns at once). The first pass's result is not looked
    /// at: the processor entries after it are not read, the memory pass runs as before.
    #[test]
    fn a_disabled_generic_initiator_ends_linux_first_pass() {
        let gi = |pxm, enabled| Entry::Initiator { pxm, enabled };
        let table = |first: Entry| {
            [
                cpu(0, 2),
                first,
                cpu(1, 0),
                gi(4, true),
                mem(0, 1 << 30, 1, true),
                mem(1 << 30, 1 << 30, 0, true),
            ]
        };
        for first in [gi(3, false), gi(MAX_PXM_DOMAINS, true)] {
            let t = table(first);
            let l = Layout::from_srat(3, || t.iter().copied(), &mut String::new()).unwrap();
            // Pass 1: PXM 2 (APIC 0) -> node 0, then the walk ends; pass 2: PXM 1 -> node 1,
            // PXM 0 -> node 2.
            assert_eq!(l.nodes(), 3, "{first:?}");
            assert_eq!(
                [0, 1, 2].map(|n| l.pxm(NodeId::new(n)).unwrap()),
                [2, 1, 0],
                "{first:?}"
            );
            assert_eq!(l.cpus(), &[(0, NodeId::new(0))], "{first:?}");
        }
    }

    /// `acpi_parse_lapic` and `acpi_parse_x2apic` return before registering a processor whose
    /// id is the invalid one ("Ignore invalid ID": 0xff for a local APIC, 0xffffffff for a local
    /// x2APIC); of the others, only an enabled one is registered enabled and started.
    #[test]
    fn madt_processors_with_the_invalid_apic_id_are_not_started() {
        assert!(!madt_starts(0xff, false, 1), "local APIC id 0xff");
        assert!(!madt_starts(0xffff_ffff, true, 1), "x2APIC id 0xffffffff");
        assert!(madt_starts(0xfe, false, 1) && madt_starts(0x100, true, 1));
        assert!(!madt_starts(3, false, 2), "online capable only");
        assert!(!madt_starts(3, true, 0), "disabled");
    }

    #[test]
    fn a_slit_with_a_remote_distance_of_ten_is_not_used() {
        let l = Layout::from_srat(1, || [cpu(0, 0), cpu(1, 1)].into_iter(), &mut String::new())
            .unwrap();
        let mut log = String::new();
        let mut d = [0; 4];
        assert!(
            !l.distances(Some((&[10, 10, 10, 10], 2)), &mut d, &mut log)
                .unwrap()
        );
        assert_eq!(log, "ACPI: SLIT table looks invalid. Not used.\n");
        assert_eq!(d, [10, 20, 20, 10]);
        assert!(
            !l.distances(Some((&[10, 20, 20, 11], 2)), &mut d, &mut log)
                .unwrap(),
            "a diagonal other than 10"
        );
        assert!(
            !l.distances(Some((&[10, 20, 20], 2)), &mut d, &mut log)
                .unwrap(),
            "a table shorter than its count"
        );
        assert!(l.distances(None, &mut d, &mut log).unwrap());
        assert_eq!(d, [10, 20, 20, 10]);
        assert!(
            l.distances(Some((&[10, 11, 255, 10], 2)), &mut d, &mut log)
                .unwrap()
        );
        assert_eq!(d, [10, 11, 255, 10]);
    }

    /// Linux's `slit_valid` checks only the diagonal (10) and remote entries (> 10): a SLIT of
    /// more localities than numaframe has node ids is as valid as any other.
    #[test]
    fn a_valid_slit_of_more_than_1024_localities_is_used() {
        let l = Layout::from_srat(2, || [cpu(0, 0), cpu(1, 1)].into_iter(), &mut String::new())
            .unwrap();
        let count = 1025;
        let mut slit = vec![20u8; count * count];
        for i in 0..count {
            slit[i * count + i] = 10;
        }
        slit[1] = 30;
        slit[count] = 30;
        let (mut d, mut log) = ([0; 4], String::new());
        let used = l.distances(Some((&slit, count)), &mut d, &mut log).unwrap();
        assert!(used, "{log}");
        assert_eq!(d, [10, 30, 30, 10]);
    }

    /// Linux maps a proximity domain to a node only below `MAX_PXM_DOMAINS`
    /// (`acpi_map_pxm_to_node`: `pxm < 0 || pxm >= MAX_PXM_DOMAINS` gives `NUMA_NO_NODE`),
    /// which is `MAX_NUMNODES` when that is above 256: 1024 with `CONFIG_NODES_SHIFT=10`. A
    /// processor or memory entry whose domain gets no node is "Too many proximity domains" and
    /// `bad_srat()`, and x86 then does not use the SRAT at all (`x86_acpi_numa_init` returns
    /// `-EINVAL` when `srat_disabled()`).
    #[test]
    fn a_domain_of_1024_or_more_makes_linux_refuse_the_srat() {
        let x2 = |pxm| Entry::Cpu {
            apic: 0x100,
            x2apic: true,
            pxm,
            enabled: true,
        };
        let m = |pxm| mem(0, 1 << 30, pxm, true);
        let used =
            |rev: u8, e: [Entry; 2]| Layout::from_srat(rev, || e.into_iter(), &mut String::new());
        assert!(
            used(2, [x2(1023), m(0)]).is_ok(),
            "1023 is the last domain Linux maps"
        );
        assert_eq!(used(2, [x2(1024), m(0)]).unwrap_err(), SratError::NotUsed);
        assert_eq!(
            used(2, [cpu(0, 0), m(5000)]).unwrap_err(),
            SratError::NotUsed
        );
        let mut log = String::new();
        assert_eq!(
            Layout::from_srat(3, || [cpu(0, 0x400), m(0)].into_iter(), &mut log).unwrap_err(),
            SratError::NotUsed,
            "a revision-2+ local APIC entry's domain has all 32 bits"
        );
        assert!(log.ends_with("ACPI: SRAT: SRAT not used.\n"), "{log}");
        assert!(
            used(1, [cpu(0, 0), m(0x1400)]).is_ok(),
            "a revision-1 memory entry's domain is its low 8 bits (0)"
        );
    }

    /// Linux's walk of a table's subtables (`acpi_parse_entries_array`) goes on while a whole
    /// subtable header lies before the table's last byte (`entry + 2 < table_end`) and returns
    /// `-EINVAL` at a subtable of length 0 ("Invalid zero length"). The memory pass's result is
    /// `acpi_numa_init`'s (`if (cnt < 0) return cnt;`), so x86 then boots without NUMA, even
    /// with the entries before that subtable already read.
    #[test]
    fn a_subtable_of_length_zero_makes_linux_refuse_the_srat() {
        // Local APIC affinity: APIC 0 in PXM 0; memory affinity: PXM 0, 1 GiB from 0.
        let mut t = cpu_and_memory_table(0, 1 << 30);
        let good = t.len();
        let used = |t: &[u8]| Layout::from_srat(3, || entries(t), &mut String::new()).is_ok();
        assert!(used(&t));
        // A header of length 0 with a byte after it: Linux's walk reads it and fails.
        t.extend([0, 0, 0]);
        assert!(!used(&t));
        t.truncate(good);
        t.extend([0x10, 0, 0, 0]);
        assert!(!used(&t), "whatever the subtable's type");
        // A header of length 0 that ends the table: Linux's walk stops before it.
        t.truncate(good);
        t.extend([0, 0]);
        assert!(used(&t));
    }

    #[test]
    fn x2apic_entries_keep_every_bit_and_print_four_digits() {
        let e = Entry::Cpu {
            apic: 0x1234,
            x2apic: true,
            pxm: 0x300,
            enabled: true,
        };
        let mut log = String::new();
        let l = Layout::from_srat(1, || [e].into_iter(), &mut log).unwrap();
        assert_eq!(l.pxm(NodeId::new(0)), Some(0x300));
        assert_eq!(log, "SRAT: PXM 768 -> APIC 0x1234 -> Node 0\n");
        let many = || (0..=MAX_NODES as u32).map(|p| cpu(p, p));
        assert_eq!(
            Layout::from_srat(2, many, &mut String::new()).unwrap_err(),
            SratError::TooManyDomains(MAX_NODES as u32)
        );
    }
}
