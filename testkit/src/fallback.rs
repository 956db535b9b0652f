//! Owned storage for the core's fallback build, for the tests and benchmarks that call
//! `build_fallback` directly instead of booting a machine.

use numaframe::zonelist::{FallbackTable, NodeStates, Scratch};
use numaframe::{NodeId, Topology};

/// The node states a fallback build of `topo` sees: its nodes with memory and with CPUs.
pub fn node_states(topo: &Topology<'_>) -> NodeStates {
    NodeStates {
        memory: topo.memory_nodes(),
        cpus: topo.cpu_nodes(),
    }
}

/// What a fallback build of `n` nodes writes into, on the heap (a booted machine carves the
/// same tables from its own memory): the table's `n × n` ids and `n` lengths, and the build's
/// scratch.
#[derive(Debug)]
pub struct FallbackStorage {
    n: usize,
    ids: Vec<NodeId>,
    lens: Vec<u16>,
    load: Vec<u32>,
    keys: Vec<u64>,
}

/// The table and the scratch over one [`FallbackStorage`], borrowed together.
#[derive(Debug)]
pub struct FallbackParts<'a> {
    /// The fallback table.
    pub table: FallbackTable<'a>,
    /// The build's scratch.
    pub scratch: Scratch<'a>,
}

impl FallbackStorage {
    /// Storage for `n` nodes.
    pub fn new(n: usize) -> FallbackStorage {
        FallbackStorage {
            n,
            ids: vec![NodeId::default(); n * n],
            lens: vec![0; n],
            load: vec![0; n],
            keys: vec![0; n],
        }
    }

    /// An empty table and the scratch, to build into once or many times.
    pub fn parts(&mut self) -> FallbackParts<'_> {
        FallbackParts {
            table: FallbackTable::new(self.n, &mut self.ids, &mut self.lens)
                .expect("storage sized for n nodes"),
            scratch: Scratch {
                load: &mut self.load,
                keys: &mut self.keys,
            },
        }
    }
}
