//! Machine tables that own their data, and the boot that tests repeat.

use numaframe::{
    BootError, BootOptions, Machine, MemoryRange, NodeId, NodeInfo, Pfn, PhysMemory, PhysRange,
    Topology,
};
use numaframe_testkit_base::{back_to_back, uniform_distances};

/// What `Machine::boot` borrows, owned: distances, node states, memory ranges, and the node of
/// each CPU to register.
#[derive(Clone, Debug)]
pub struct Spec {
    /// Row-major distances.
    pub distances: Vec<u8>,
    /// Node states.
    pub infos: Vec<NodeInfo>,
    /// Memory ranges.
    pub ranges: Vec<MemoryRange>,
    /// The node of each CPU, by CPU index.
    pub cpus: Vec<NodeId>,
}

impl Spec {
    /// Nodes of `frames[i]` frames, back to back from frame `base` (a node of 0 frames is
    /// memoryless), every node with CPUs, distance 10 local and 20 remote; no CPUs registered.
    pub fn back_to_back(frames: &[u64], base: u64) -> Spec {
        let infos = frames.iter().map(|&f| node_info(true, f > 0)).collect();
        let ranges = back_to_back(frames, base)
            .into_iter()
            .map(|s| memory_range(s.node, s.start, s.end))
            .collect();
        Spec {
            distances: uniform_distances(frames.len()),
            infos,
            ranges,
            cpus: Vec::new(),
        }
    }

    /// `n` nodes of `frames` frames each, back to back from frame `base` (see
    /// [`Spec::back_to_back`]).
    pub fn uniform(n: usize, frames: u64, base: u64) -> Spec {
        Spec::back_to_back(&vec![frames; n], base)
    }

    /// Three nodes: 0 and 1 with CPUs and `ranges` of memory, 2 CPU-less and memoryless with
    /// initiator 0, the target of hot-adds. Distances 10 local, 20 between nodes 0 and 1, 14 and
    /// 24 from them to node 2. CPUs 0, 1 and 2 sit on nodes 0, 1 and 0.
    pub fn with_hot_add_target(ranges: Vec<MemoryRange>) -> Spec {
        Spec {
            distances: vec![10, 20, 14, 20, 10, 24, 14, 24, 10],
            infos: vec![
                node_info(true, true),
                node_info(true, true),
                NodeInfo {
                    initiator: Some(NodeId::new(0)),
                    ..NodeInfo::default()
                },
            ],
            ranges,
            cpus: [0, 1, 0].map(NodeId::new).to_vec(),
        }
    }

    /// The same tables with CPUs registered on `nodes` (CPU `i` on `nodes[i]`).
    pub fn with_cpus(self, nodes: &[usize]) -> Spec {
        Spec {
            cpus: nodes.iter().map(|&i| NodeId::new(i)).collect(),
            ..self
        }
    }

    /// The topology of the tables.
    ///
    /// # Panics
    /// If the tables are not a valid topology (a test's own tables are).
    pub fn topology(&self) -> Topology<'_> {
        Topology::new(&self.distances, &self.infos).expect("the spec's tables are a valid topology")
    }

    /// Boot options with the spec's CPUs, the min watermark at 0 (`min_free_kbytes` 0) and no `Dma32`
    /// protection (`lowmem_reserve_ratio` 0), so that every free page can be allocated; the
    /// rest as `BootOptions::default()`.
    pub fn options(&self) -> BootOptions<'_> {
        BootOptions {
            cpus: &self.cpus,
            min_free_kbytes: Some(0),
            lowmem_reserve_ratio: 0,
            ..BootOptions::default()
        }
    }

    /// Boots the tables over `mem` with [`Spec::options`].
    ///
    /// # Panics
    /// If the boot fails.
    pub fn boot<'a, M: PhysMemory>(&'a self, mem: &'a M) -> Machine<'a> {
        self.boot_with(mem, self.options())
    }

    /// Boots the tables over `mem` with `opts`.
    ///
    /// # Panics
    /// If the boot fails.
    pub fn boot_with<'a, M: PhysMemory>(
        &'a self,
        mem: &'a M,
        opts: BootOptions<'_>,
    ) -> Machine<'a> {
        self.try_boot_with(mem, opts)
            .unwrap_or_else(|e| panic!("the spec boots: {e}"))
    }

    /// Boots the tables over `mem` with `opts`: the machine or the boot's error.
    ///
    /// # Errors
    /// The boot's [`BootError`].
    pub fn try_boot_with<'a, M: PhysMemory>(
        &'a self,
        mem: &'a M,
        opts: BootOptions<'_>,
    ) -> Result<Machine<'a>, BootError> {
        Machine::boot(self.topology(), mem, &self.ranges, opts)
    }
}

/// A node's state: CPUs and memory as given, nothing else known.
pub fn node_info(has_cpus: bool, has_memory: bool) -> NodeInfo {
    NodeInfo {
        has_cpus,
        has_memory,
        ..NodeInfo::default()
    }
}

/// Node states from per-node flags (`has_cpus[i]`, `has_memory[i]` for node `i`).
///
/// # Panics
/// If the two slices differ in length.
pub fn node_infos(has_cpus: &[bool], has_memory: &[bool]) -> Vec<NodeInfo> {
    assert_eq!(
        has_cpus.len(),
        has_memory.len(),
        "one flag of each per node"
    );
    has_cpus
        .iter()
        .zip(has_memory)
        .map(|(&c, &m)| node_info(c, m))
        .collect()
}

/// Frames `start..end` on node `node`.
///
/// # Panics
/// If `end < start`.
pub fn memory_range(node: usize, start: u64, end: u64) -> MemoryRange {
    MemoryRange {
        node: NodeId::new(node),
        range: PhysRange::new(Pfn::new(start), Pfn::new(end)).expect("start <= end"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SparseMem;

    #[test]
    fn back_to_back_skips_memoryless_nodes() {
        let s = Spec::back_to_back(&[1024, 0, 512], 7);
        assert_eq!(
            s.ranges,
            [memory_range(0, 7, 1031), memory_range(2, 1031, 1543)]
        );
        assert_eq!(
            s.infos
                .iter()
                .map(|i| (i.has_cpus, i.has_memory))
                .collect::<Vec<_>>(),
            [(true, true), (true, false), (true, true)]
        );
        let mem = SparseMem::default();
        let m = s.boot(&mem);
        assert_eq!(m.nodes().len(), 3);
        assert_eq!(m.node(NodeId::new(1)).unwrap().free_pages(), 0);
        m.check_invariants().unwrap();
    }

    #[test]
    fn the_hot_add_target_boots_with_three_cpus() {
        let s =
            Spec::with_hot_add_target(vec![memory_range(0, 0, 2048), memory_range(1, 4096, 6000)]);
        let mem = SparseMem::default();
        let m = s.boot(&mem);
        assert_eq!(m.cpu_count(), 3);
        assert!(!m.memory_nodes().contains(NodeId::new(2)));
        assert_eq!(s.clone().with_cpus(&[2]).cpus, [NodeId::new(2)]);
    }
}
