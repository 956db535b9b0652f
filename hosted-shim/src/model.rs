//! A placement model: what throughput a placement of memory traffic can reach when every node's
//! memory and every socket-to-socket link is a resource with a bandwidth.
//!
//! # The model
//! - A **placement** says, for each CPU (initiator) node, which share of its memory traffic goes
//!   to each memory node ([`Placement`]). Shares are measured by running the real allocator
//!   ([`allocator_placement`]), not written down by hand.
//! - **Resources** ([`Resources`]): each node's memory, with the node's `bandwidth_gbps`; and the
//!   links between packages, each with the machine's `socket_link_gbps`. Traffic from a CPU node
//!   to a memory node in another package crosses the link between the two packages. Packages are
//!   fully connected (one direct link per pair, no routing through a third package).
//! - **Links count per direction** ([`LinkModel::PerDirection`], what the CLI uses): socket
//!   interconnects (UPI, Infinity Fabric, CXL) are full duplex, so the traffic of package `a`'s
//!   CPUs to package `b`'s memory and that of `b`'s CPUs to `a`'s memory do not compete; each
//!   direction is a resource of capacity `socket_link_gbps`. [`LinkModel::Shared`] (one resource
//!   per pair, both directions) is there to show how much the choice matters.
//! - Every CPU node runs at the same rate `r` (GB/s). Resource `R` then carries `r · load(R)`,
//!   where `load(R)` sums the shares that use it. The **modeled throughput** is the largest
//!   uniform rate that keeps every resource within capacity, times the number of CPU nodes:
//!   `min over R of capacity(R) / load(R)`, times `#CPU nodes`. The resources that reach that
//!   minimum are the bottlenecks.
//!
//! The model knows nothing of latency, caches, prefetching or queueing: it is a bandwidth bound.
#![deny(unsafe_code)]

use std::collections::BTreeMap;
use std::fmt;

use numaframe::policy::{Policy, TaskPolicy};
use numaframe::{AllocFlags, BulkFreeError, Machine, NodeId, NodeMask, Pfn, PolicyError};

use crate::spec::MachineSpec;

/// How socket-to-socket links count as resources.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkModel {
    /// Full duplex: each direction between two packages is its own resource with the link's
    /// capacity (what the CLI uses).
    PerDirection,
    /// One resource per pair of packages, carrying both directions.
    Shared,
}

impl LinkModel {
    /// A short name for output (`per-direction`, `shared`).
    pub fn name(self) -> &'static str {
        match self {
            LinkModel::PerDirection => "per-direction",
            LinkModel::Shared => "shared",
        }
    }
}

/// One resource of the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Resource {
    /// The memory of a node.
    Memory(NodeId),
    /// The link from package `from` to package `to` (dense package numbers, see
    /// [`Resources::package`]). Under [`LinkModel::Shared`] `from < to` and it carries both
    /// directions.
    Link {
        /// Package of the CPUs (the lower package for a shared link).
        from: usize,
        /// Package of the memory (the higher package for a shared link).
        to: usize,
    },
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Resource::Memory(n) => write!(f, "memory of node {n}"),
            Resource::Link { from, to } => write!(f, "link p{from}->p{to}"),
        }
    }
}

/// Why the model cannot be evaluated.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ModelError {
    /// The placement has no CPU node.
    NoCpuNodes,
    /// A node receives traffic but has no bandwidth.
    NoBandwidth {
        /// The node.
        node: NodeId,
    },
    /// Traffic crosses packages but the machine has no socket link bandwidth.
    NoLinkBandwidth,
    /// A node outside the machine.
    UnknownNode {
        /// The node.
        node: NodeId,
    },
    /// A CPU node's shares are negative, not finite, or do not add up to 1.
    BadShares {
        /// The CPU node.
        cpu: NodeId,
    },
    /// The policy could not be built for the machine.
    Policy(PolicyError),
    /// A bulk allocation placed fewer pages than asked (the machine was too small).
    Short {
        /// The CPU node allocating.
        cpu: NodeId,
        /// Pages placed.
        placed: usize,
        /// Pages asked for.
        asked: usize,
    },
    /// Freeing the sample failed (a bug in numaframe).
    Free(BulkFreeError),
}

impl fmt::Display for ModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModelError::NoCpuNodes => write!(f, "the machine has no CPU node to model"),
            ModelError::NoBandwidth { node } => {
                write!(f, "node {node} receives traffic but has no bandwidth_gbps")
            }
            ModelError::NoLinkBandwidth => write!(
                f,
                "traffic crosses sockets but the machine has no socket_link_gbps"
            ),
            ModelError::UnknownNode { node } => write!(f, "node {node} is not in the machine"),
            ModelError::BadShares { cpu } => {
                write!(f, "the shares of CPU node {cpu} do not add up to 1")
            }
            ModelError::Policy(e) => write!(f, "policy: {e}"),
            ModelError::Short { cpu, placed, asked } => write!(
                f,
                "CPU node {cpu}: the allocator placed {placed} of {asked} pages"
            ),
            ModelError::Free(e) => write!(f, "freeing the sample: {e}"),
        }
    }
}

impl std::error::Error for ModelError {}

/// The resources of a machine: memory bandwidth per node, the package of each node, the link
/// bandwidth and how links count.
#[derive(Clone, Debug, PartialEq)]
pub struct Resources {
    memory_gbps: Vec<Option<f64>>,
    package: Vec<usize>,
    link_gbps: Option<f64>,
    links: LinkModel,
}

impl Resources {
    /// Resources from explicit tables: `memory_gbps[n]` and `package[n]` for node `n`.
    ///
    /// # Errors
    /// [`ModelError::UnknownNode`] (naming the first node past the shorter table) if the two
    /// tables differ in length.
    pub fn new(
        memory_gbps: Vec<Option<f64>>,
        package: Vec<usize>,
        link_gbps: Option<f64>,
        links: LinkModel,
    ) -> Result<Resources, ModelError> {
        if memory_gbps.len() != package.len() {
            let n = memory_gbps.len().min(package.len());
            return Err(ModelError::UnknownNode {
                node: NodeId::try_new(n).unwrap_or_default(),
            });
        }
        Ok(Resources {
            memory_gbps,
            package,
            link_gbps,
            links,
        })
    }

    /// The resources of `spec`: node bandwidths, [`packages`] and `socket_link_gbps`.
    pub fn from_spec(spec: &MachineSpec, links: LinkModel) -> Resources {
        Resources {
            memory_gbps: spec
                .nodes()
                .iter()
                .map(|n| n.bandwidth_gbps.map(f64::from))
                .collect(),
            package: packages(spec),
            link_gbps: spec.socket_link_gbps().map(f64::from),
            links,
        }
    }

    /// The package of `node` (dense, `0..`), or `None` outside the machine.
    pub fn package(&self, node: NodeId) -> Option<usize> {
        self.package.get(node.index()).copied()
    }

    /// The memory bandwidth of `node`, if known.
    pub fn memory_gbps(&self, node: NodeId) -> Option<f64> {
        self.memory_gbps.get(node.index()).copied().flatten()
    }

    /// How links count.
    pub fn links(&self) -> LinkModel {
        self.links
    }

    /// The link bandwidth, if known.
    pub fn link_gbps(&self) -> Option<f64> {
        self.link_gbps
    }

    /// The same machine with links counted as `links`.
    #[must_use]
    pub fn with_links(&self, links: LinkModel) -> Resources {
        Resources {
            links,
            ..self.clone()
        }
    }

    /// The capacity of `r` in GB/s, if known.
    pub fn capacity(&self, r: Resource) -> Option<f64> {
        match r {
            Resource::Memory(n) => self.memory_gbps(n),
            Resource::Link { .. } => self.link_gbps,
        }
    }
}

/// The package of every node, dense-numbered `0..` in order of each package's lowest node.
///
/// The rule is the core's [`Topology::package_of`](numaframe::Topology::package_of), which the
/// socket-aware policy applies; a node with no package gets one of its own.
pub fn packages(spec: &MachineSpec) -> Vec<usize> {
    let topo = spec.topology();
    let n = spec.len();
    // Keys from the core's rule; a node with no package gets a key of its own above them.
    let keys: Vec<u64> = (0..n)
        .map(|i| {
            topo.package_of(NodeId::new(i))
                .map_or(u64::from(u32::MAX) + 1 + i as u64, u64::from)
        })
        .collect();
    let mut dense: Vec<u64> = Vec::new();
    keys.iter()
        .map(|k| match dense.iter().position(|d| d == k) {
            Some(p) => p,
            None => {
                dense.push(*k);
                dense.len() - 1
            }
        })
        .collect()
}

/// For each CPU node, the share of its traffic that goes to each memory node.
///
/// Invariant: every row's shares are finite, non-negative and add up to 1 (within 1e-9).
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    rows: Vec<(NodeId, Vec<(NodeId, f64)>)>,
}

impl Placement {
    /// A placement from shares per CPU node. Zero shares are dropped.
    ///
    /// # Errors
    /// [`ModelError::NoCpuNodes`] without rows, [`ModelError::BadShares`] for a row whose
    /// shares are negative, not finite, or do not add up to 1.
    pub fn new(rows: Vec<(NodeId, Vec<(NodeId, f64)>)>) -> Result<Placement, ModelError> {
        if rows.is_empty() {
            return Err(ModelError::NoCpuNodes);
        }
        let mut out = Vec::with_capacity(rows.len());
        for (cpu, shares) in rows {
            let ok = shares.iter().all(|(_, s)| s.is_finite() && *s >= 0.0);
            let sum: f64 = shares.iter().map(|(_, s)| s).sum();
            if !ok || (sum - 1.0).abs() > 1e-9 {
                return Err(ModelError::BadShares { cpu });
            }
            let shares = shares.into_iter().filter(|(_, s)| *s > 0.0).collect();
            out.push((cpu, shares));
        }
        Ok(Placement { rows: out })
    }

    /// A placement from page counts per CPU node: shares are the counts over their sum.
    ///
    /// # Errors
    /// [`ModelError::NoCpuNodes`] without rows, [`ModelError::BadShares`] for a row without
    /// pages.
    pub fn from_counts(rows: &[(NodeId, Vec<(NodeId, u64)>)]) -> Result<Placement, ModelError> {
        let rows = rows
            .iter()
            .map(|(cpu, counts)| {
                let total: u64 = counts.iter().map(|(_, c)| c).sum();
                if total == 0 {
                    return Err(ModelError::BadShares { cpu: *cpu });
                }
                let shares = counts
                    .iter()
                    .map(|&(n, c)| (n, c as f64 / total as f64))
                    .collect();
                Ok((*cpu, shares))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Placement::new(rows)
    }

    /// The rows: each CPU node with its non-zero shares per memory node.
    pub fn rows(&self) -> &[(NodeId, Vec<(NodeId, f64)>)] {
        &self.rows
    }

    /// The memory nodes that receive traffic, ascending.
    pub fn memory_nodes(&self) -> Vec<NodeId> {
        let mut nodes: Vec<NodeId> = self
            .rows
            .iter()
            .flat_map(|(_, s)| s.iter().map(|(n, _)| *n))
            .collect();
        nodes.sort_unstable();
        nodes.dedup();
        nodes
    }
}

/// What the model says about one placement.
#[derive(Clone, Debug, PartialEq)]
pub struct Throughput {
    /// Modeled throughput of the whole machine, GB/s.
    pub total_gbps: f64,
    /// The uniform rate of each CPU node, GB/s.
    pub per_cpu_node_gbps: f64,
    /// The resources at capacity at that rate, ascending.
    pub bottlenecks: Vec<Resource>,
    /// Every loaded resource: (resource, load per unit rate, capacity GB/s), ascending.
    pub loads: Vec<(Resource, f64, f64)>,
}

/// The modeled throughput of `placement` on `res`: the largest rate `r`, the same for every
/// CPU node, with `r · load(R) <= capacity(R)` for every resource `R`, times the number of CPU
/// nodes.
///
/// # Errors
/// [`ModelError::UnknownNode`] for a node outside `res`, [`ModelError::NoBandwidth`] for a
/// loaded node without bandwidth, [`ModelError::NoLinkBandwidth`] when traffic crosses
/// packages and the machine has no link bandwidth.
pub fn throughput(res: &Resources, placement: &Placement) -> Result<Throughput, ModelError> {
    let mut load: BTreeMap<Resource, f64> = BTreeMap::new();
    for (cpu, shares) in placement.rows() {
        let from = res
            .package(*cpu)
            .ok_or(ModelError::UnknownNode { node: *cpu })?;
        for &(node, share) in shares {
            let to = res.package(node).ok_or(ModelError::UnknownNode { node })?;
            *load.entry(Resource::Memory(node)).or_default() += share;
            if from != to {
                let link = match res.links {
                    LinkModel::PerDirection => Resource::Link { from, to },
                    LinkModel::Shared => Resource::Link {
                        from: from.min(to),
                        to: from.max(to),
                    },
                };
                *load.entry(link).or_default() += share;
            }
        }
    }
    let mut loads = Vec::with_capacity(load.len());
    for (&r, &l) in &load {
        let cap = res.capacity(r).ok_or(match r {
            Resource::Memory(node) => ModelError::NoBandwidth { node },
            Resource::Link { .. } => ModelError::NoLinkBandwidth,
        })?;
        loads.push((r, l, cap));
    }
    // Every row adds up to 1, so some memory resource carries load.
    let rate = loads
        .iter()
        .map(|&(_, l, cap)| cap / l)
        .fold(f64::INFINITY, f64::min);
    if !rate.is_finite() {
        return Err(ModelError::NoCpuNodes);
    }
    let bottlenecks = loads
        .iter()
        .filter(|&&(_, l, cap)| cap / l <= rate * (1.0 + 1e-9))
        .map(|&(r, _, _)| r)
        .collect();
    Ok(Throughput {
        total_gbps: rate * placement.rows().len() as f64,
        per_cpu_node_gbps: rate,
        bottlenecks,
        loads,
    })
}

/// Where the real allocator puts `pages` pages for a task with `policy` on each CPU node of
/// `cpu_nodes`: one fresh [`TaskPolicy`] per CPU node makes one bulk allocation, the frames are
/// counted by the node that owns them and freed again before the next CPU node runs.
///
/// # Errors
/// [`ModelError::Policy`] if the policy does not fit the machine, [`ModelError::Short`] if the
/// machine could not hold `pages` pages, [`ModelError::Free`] if freeing fails, and the errors
/// of [`Placement::from_counts`].
pub fn allocator_placement(
    machine: &Machine<'_>,
    policy: Policy,
    socket_aware: bool,
    cpu_nodes: &NodeMask,
    pages: usize,
) -> Result<Placement, ModelError> {
    let mut out = vec![Pfn::new(0); pages];
    let nodes = machine.topology().len();
    let mut rows = Vec::new();
    for cpu in cpu_nodes {
        let mut task =
            TaskPolicy::new(machine, policy, socket_aware).map_err(ModelError::Policy)?;
        let r = task.alloc_bulk(machine, cpu, AllocFlags::empty(), &mut out);
        let placed = &out[..r.placed];
        let mut counts = vec![0u64; nodes];
        for &pfn in placed {
            if let Some(n) = machine.node_of(pfn) {
                counts[n.index()] += 1;
            }
        }
        machine.free_bulk(placed).map_err(ModelError::Free)?;
        if r.placed < pages {
            return Err(ModelError::Short {
                cpu,
                placed: r.placed,
                asked: pages,
            });
        }
        let counts = counts
            .into_iter()
            .enumerate()
            .filter(|(_, c)| *c > 0)
            .map(|(n, c)| (NodeId::new(n), c))
            .collect();
        rows.push((cpu, counts));
    }
    Placement::from_counts(&rows)
}

/// The three placements `numaframe interleave --model` compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// Every CPU node allocates locally (`Policy::Local`): DRAM only on `cxl-2socket`.
    LocalDram,
    /// Weighted interleave over the whole mask from every CPU node.
    FlatInterleave,
    /// Weighted interleave restricted to the CPU node's package (socket-aware mode).
    SocketAwareInterleave,
}

impl Scenario {
    /// All three, in the order they are printed.
    pub const ALL: [Scenario; 3] = [
        Scenario::LocalDram,
        Scenario::FlatInterleave,
        Scenario::SocketAwareInterleave,
    ];

    /// The name printed for it.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::LocalDram => "local DRAM only",
            Scenario::FlatInterleave => "flat weighted interleave",
            Scenario::SocketAwareInterleave => "socket-aware weighted interleave",
        }
    }

    /// The policy and socket-awareness it runs with, for the interleave mask `mask`.
    pub fn policy(self, mask: NodeMask) -> (Policy, bool) {
        match self {
            Scenario::LocalDram => (Policy::Local, false),
            Scenario::FlatInterleave => (Policy::WeightedInterleave(mask), false),
            Scenario::SocketAwareInterleave => (Policy::WeightedInterleave(mask), true),
        }
    }

    /// The seed's measurement on `cxl-2socket` with weights 3,3,1,1 over all four nodes,
    /// GB/s.
    pub fn seed_measured_gbps(self) -> f64 {
        match self {
            Scenario::LocalDram => 966.0,
            Scenario::FlatInterleave => 903.0,
            Scenario::SocketAwareInterleave => 1329.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::presets::preset;

    fn n(i: usize) -> NodeId {
        NodeId::new(i)
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9 * b.abs().max(1.0)
    }

    /// cxl-2socket by hand: nodes 0,1 DRAM 300 GB/s in packages 0,1; nodes 2,3 CXL 100 GB/s in
    /// packages 0,1; links 150 GB/s.
    fn cxl(links: LinkModel) -> Resources {
        Resources::new(
            vec![Some(300.0), Some(300.0), Some(100.0), Some(100.0)],
            vec![0, 1, 0, 1],
            Some(150.0),
            links,
        )
        .unwrap()
    }

    fn rows(r: &[(usize, &[(usize, f64)])]) -> Placement {
        Placement::new(
            r.iter()
                .map(|(c, s)| (n(*c), s.iter().map(|&(m, f)| (n(m), f)).collect()))
                .collect(),
        )
        .unwrap()
    }

    #[test]
    fn one_node_one_cpu() {
        // One CPU node, all traffic to its own 50 GB/s memory: 50 GB/s.
        let res = Resources::new(vec![Some(50.0)], vec![0], None, LinkModel::PerDirection).unwrap();
        let t = throughput(&res, &rows(&[(0, &[(0, 1.0)])])).unwrap();
        assert!(close(t.total_gbps, 50.0));
        assert_eq!(t.bottlenecks, [Resource::Memory(n(0))]);
    }

    #[test]
    fn local_dram_only() {
        // Each CPU node on its own 300 GB/s DRAM: r = 300, two CPU nodes, 600.
        let p = rows(&[(0, &[(0, 1.0)]), (1, &[(1, 1.0)])]);
        let t = throughput(&cxl(LinkModel::PerDirection), &p).unwrap();
        assert!(close(t.per_cpu_node_gbps, 300.0));
        assert!(close(t.total_gbps, 600.0));
        assert_eq!(
            t.bottlenecks,
            [Resource::Memory(n(0)), Resource::Memory(n(1))]
        );
    }

    #[test]
    fn flat_interleave_per_direction_and_shared() {
        // 3/8, 3/8, 1/8, 1/8 from both CPU nodes. Memory: node 0 carries 2·3/8 = 0.75 → 400;
        // node 2 carries 0.25 → 400. Each CPU node sends 1/2 across: per direction the load is
        // 0.5 → r = 300, total 600; shared, the one link carries 1.0 → r = 150, total 300.
        let s: &[(usize, f64)] = &[(0, 0.375), (1, 0.375), (2, 0.125), (3, 0.125)];
        let p = rows(&[(0, s), (1, s)]);
        let t = throughput(&cxl(LinkModel::PerDirection), &p).unwrap();
        assert!(close(t.total_gbps, 600.0), "{t:?}");
        assert_eq!(
            t.bottlenecks,
            [
                Resource::Link { from: 0, to: 1 },
                Resource::Link { from: 1, to: 0 }
            ]
        );
        let t = throughput(&cxl(LinkModel::Shared), &p).unwrap();
        assert!(close(t.total_gbps, 300.0), "{t:?}");
        assert_eq!(t.bottlenecks, [Resource::Link { from: 0, to: 1 }]);
    }

    #[test]
    fn socket_aware_interleave() {
        // 3:1 within each package: node 0 load 0.75 → 400, node 2 load 0.25 → 400. No link.
        let p = rows(&[(0, &[(0, 0.75), (2, 0.25)]), (1, &[(1, 0.75), (3, 0.25)])]);
        let t = throughput(&cxl(LinkModel::PerDirection), &p).unwrap();
        assert!(close(t.total_gbps, 800.0), "{t:?}");
        assert_eq!(t.bottlenecks.len(), 4);
        assert!(
            t.loads
                .iter()
                .all(|(r, _, _)| matches!(r, Resource::Memory(_)))
        );
    }

    #[test]
    fn asymmetric_placement() {
        // CPU 0 all local; CPU 1 half on node 0 across the link. Node 0 load 1.5 → 200;
        // link 1->0 load 0.5 → 300; node 1 load 0.5 → 600. r = 200, total 400.
        let p = rows(&[(0, &[(0, 1.0)]), (1, &[(0, 0.5), (1, 0.5)])]);
        let t = throughput(&cxl(LinkModel::PerDirection), &p).unwrap();
        assert!(close(t.total_gbps, 400.0), "{t:?}");
        assert_eq!(t.bottlenecks, [Resource::Memory(n(0))]);
        // With a 50 GB/s link the link binds: r = 100, total 200.
        let slow = Resources::new(
            vec![Some(300.0), Some(300.0)],
            vec![0, 1],
            Some(50.0),
            LinkModel::PerDirection,
        )
        .unwrap();
        let t = throughput(&slow, &p).unwrap();
        assert!(close(t.total_gbps, 200.0), "{t:?}");
        assert_eq!(t.bottlenecks, [Resource::Link { from: 1, to: 0 }]);
    }

    #[test]
    fn errors() {
        let no_bw =
            Resources::new(vec![Some(1.0), None], vec![0, 0], None, LinkModel::Shared).unwrap();
        let p = rows(&[(0, &[(0, 0.5), (1, 0.5)])]);
        assert_eq!(
            throughput(&no_bw, &p),
            Err(ModelError::NoBandwidth { node: n(1) })
        );
        let no_link = Resources::new(
            vec![Some(1.0), Some(1.0)],
            vec![0, 1],
            None,
            LinkModel::PerDirection,
        )
        .unwrap();
        assert_eq!(throughput(&no_link, &p), Err(ModelError::NoLinkBandwidth));
        let p3 = rows(&[(0, &[(2, 1.0)])]);
        assert_eq!(
            throughput(&no_link, &p3),
            Err(ModelError::UnknownNode { node: n(2) })
        );
        assert_eq!(Placement::new(vec![]), Err(ModelError::NoCpuNodes));
        assert_eq!(
            Placement::new(vec![(n(0), vec![(n(0), 0.5)])]),
            Err(ModelError::BadShares { cpu: n(0) })
        );
        assert_eq!(
            Placement::new(vec![(n(0), vec![(n(0), f64::NAN)])]),
            Err(ModelError::BadShares { cpu: n(0) })
        );
        assert_eq!(
            Placement::from_counts(&[(n(1), vec![(n(0), 0)])]),
            Err(ModelError::BadShares { cpu: n(1) })
        );
        assert!(Resources::new(vec![None], vec![], None, LinkModel::Shared).is_err());
    }

    #[test]
    fn from_counts_normalises() {
        let p =
            Placement::from_counts(&[(n(0), vec![(n(0), 300), (n(2), 100), (n(1), 0)])]).unwrap();
        assert_eq!(p.rows(), [(n(0), vec![(n(0), 0.75), (n(2), 0.25)])]);
        assert_eq!(p.memory_nodes(), [n(0), n(2)]);
    }

    #[test]
    fn packages_of_presets() {
        let cxl = preset("cxl-2socket").unwrap();
        assert_eq!(packages(&cxl), [0, 1, 0, 1]);
        assert_eq!(
            Resources::from_spec(&cxl, LinkModel::PerDirection),
            super::tests::cxl(LinkModel::PerDirection)
        );
        assert_eq!(
            packages(&preset("dual-socket-8node").unwrap()),
            [0, 0, 0, 0, 1, 1, 1, 1]
        );
        assert_eq!(packages(&preset("fake-64").unwrap()), [0; 64]);
    }

    #[test]
    fn packages_without_sockets() {
        use crate::spec::NodeSpec;
        // Node 0: CPUs, no socket → its own package. Node 1: CPUs, no socket. Node 2: CPU-less,
        // nearest CPU node 1. Node 3: CPU-less with an initiator 0.
        let cpu = |c: u32| NodeSpec {
            cpus: vec![c],
            memory_bytes: 1 << 30,
            ..NodeSpec::default()
        };
        let mem = NodeSpec {
            memory_bytes: 1 << 30,
            ..NodeSpec::default()
        };
        let spec = MachineSpec::new(
            "t",
            vec![
                cpu(0),
                cpu(1),
                mem.clone(),
                NodeSpec {
                    initiator: Some(n(0)),
                    ..mem
                },
            ],
            vec![
                10, 20, 30, 15, 20, 10, 15, 30, 30, 15, 10, 30, 15, 30, 30, 10,
            ],
            None,
        )
        .unwrap();
        assert_eq!(packages(&spec), [0, 1, 1, 0]);
    }
}
