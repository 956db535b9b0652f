//! The allocator state that a refused call must leave unchanged.

use numaframe::addr::NR_ORDERS;
use numaframe::{HugeCounts, HugeSize, Machine, NodeId, NodeMask, ZoneKind};

/// One zone's counters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ZoneSnap {
    /// Free pages.
    pub free: u64,
    /// Managed pages.
    pub managed: u64,
    /// Free blocks per order.
    pub buddyinfo: [u64; NR_ORDERS],
}

/// Everything a refused call must leave as it was: every zone's counters and free lists, the
/// huge-page pools, the per-CPU caches, which nodes have memory, and the fallback orders.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snap {
    /// Per node, then per zone kind in `ZoneKind::ALL` order.
    pub zones: Vec<ZoneSnap>,
    /// Per node, then per size in `HugeSize::ALL` order.
    pub pools: Vec<HugeCounts>,
    /// Pages in the per-CPU caches.
    pub cached: u64,
    /// The nodes with memory.
    pub memory_nodes: NodeMask,
    /// Every node's fallback order.
    pub fallback: Vec<Vec<NodeId>>,
}

impl Snap {
    /// The state of `m` now.
    pub fn of(m: &Machine<'_>) -> Snap {
        let mut zones = Vec::new();
        let mut pools = Vec::new();
        let mut fallback = Vec::new();
        for node in m.nodes() {
            for kind in ZoneKind::ALL {
                let z = node.zone(kind);
                let c = z.counters();
                zones.push(ZoneSnap {
                    free: c.free,
                    managed: c.managed,
                    buddyinfo: z.buddyinfo(),
                });
            }
            for size in HugeSize::ALL {
                pools.push(m.huge_counts(node.id(), size));
            }
            let mut row = vec![NodeId::new(0); m.nodes().len()];
            let k = m.fallback_order(node.id(), &mut row);
            row.truncate(k);
            fallback.push(row);
        }
        Snap {
            zones,
            pools,
            cached: m.cached_pages(),
            memory_nodes: m.memory_nodes(),
            fallback,
        }
    }
}
