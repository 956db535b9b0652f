//! Memory policies (Linux's `mempolicy`), with a bulk path for every policy and a
//! socket-aware mode for machines with CXL or HBM memory.
//!
//! A [`TaskPolicy`] is owned by one task or vCPU and passed to every allocation: it holds the
//! policy and the interleave cursor, so tasks never contend on policy state.
//!
//! # Bulk allocation and the interleave state
//! A weighted-interleave bulk of `N` pages is planned with
//! [`plan_bulk`]: per-node counts and a final state identical to
//! `N` single-page calls, and at most one node bulk call per policy node, the partly consumed
//! node included.
//!
//! When a node cannot supply its share, the rest of that share falls back along *that node's*
//! zonelist (Linux's preferred-node bulk semantics): the pages land elsewhere, but they still
//! count against the planned node's turn, and the interleave state is the one the plan
//! computed. So counts per *planned* node and the final state never depend on memory pressure;
//! where the pages physically land does. If the whole machine runs out, the call returns fewer
//! pages than asked and the state still advances by the full plan, as Linux's
//! `alloc_pages_bulk_weighted_interleave()` does.
//!
//! # Socket-aware mode
//! A package holds the CPU nodes of one socket plus the memory-only nodes whose initiator (or,
//! failing that, nearest CPU node) is in it. With socket awareness, candidates are first
//! restricted to the package of the allocating CPU's node, before weights apply. Only when no
//! node of the package can serve (from its zones, or for a huge page from its pools) does the
//! policy fall back to the whole mask. A bulk chooses once, at its start: if the package runs
//! out part way, the rest of the bulk stays planned over it (and falls back along the planned
//! nodes' zonelists, as above), where single pages would switch to the whole mask.
#![deny(unsafe_code)]

use crate::addr::{HugeSize, Order, Pfn};
use crate::error::PolicyError;
use crate::interleave::{IlState, Weights, plan_bulk};
use crate::machine::{AllocFlags, Machine, Request};
use crate::topology::{NodeId, NodeMask, Topology};

/// Where a policy places memory (Linux's `MPOL_*` modes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Policy {
    /// The allocating CPU's node, then its zonelist (`MPOL_LOCAL`).
    Local,
    /// One node, then its zonelist (`MPOL_PREFERRED`).
    Preferred(NodeId),
    /// The local zonelist restricted to the mask, then the whole local zonelist
    /// (`MPOL_PREFERRED_MANY`).
    PreferredMany(NodeMask),
    /// The local zonelist restricted to the mask, never outside it (`MPOL_BIND`) but in the
    /// pass without watermarks of a request with [`AllocFlags::RESERVE`], which walks the whole
    /// zonelist, as Linux's slow path drops the nodemask once an allocation may use the
    /// reserves.
    Bind(NodeMask),
    /// One page per node in turn (`MPOL_INTERLEAVE`), over the mask's nodes that have memory
    /// (Linux's mask ∩ `N_MEMORY`; all of the mask if none has).
    Interleave(NodeMask),
    /// `weight[n]` pages per node in turn (`MPOL_WEIGHTED_INTERLEAVE`); weights are the
    /// machine's table, see [`Machine::set_weights`].
    WeightedInterleave(NodeMask),
}

impl Policy {
    fn mask(&self) -> Option<&NodeMask> {
        match self {
            Policy::Local | Policy::Preferred(_) => None,
            Policy::PreferredMany(m)
            | Policy::Bind(m)
            | Policy::Interleave(m)
            | Policy::WeightedInterleave(m) => Some(m),
        }
    }
}

/// A task's (or vCPU's) memory policy and interleave cursor.
#[derive(Clone, Debug)]
pub struct TaskPolicy {
    policy: Policy,
    socket_aware: bool,
    il: IlState,
    /// The package restriction last computed: (cpu node, mask ∩ package).
    package: Option<(NodeId, NodeMask)>,
    /// The mask's nodes with memory last computed, with the layout count they were read at:
    /// reused until a hot-add or an offline publishes a new layout.
    with_memory: Option<(u64, NodeMask)>,
}

/// What a bulk allocation did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[must_use = "the frames placed must be freed"]
pub struct BulkResult {
    /// Frames placed at the start of the output slice.
    pub placed: usize,
    /// Node bulk calls made (each walks one node's zonelist, taking each zone lock once).
    pub node_calls: usize,
}

impl TaskPolicy {
    /// A policy for a task on `machine`.
    ///
    /// # Errors
    /// [`PolicyError::EmptyMask`] for an empty mask and [`PolicyError::UnknownNode`] for a node
    /// outside the machine.
    pub fn new(
        machine: &Machine<'_>,
        policy: Policy,
        socket_aware: bool,
    ) -> Result<TaskPolicy, PolicyError> {
        let topo = machine.topology();
        if let Policy::Preferred(n) = policy
            && !topo.contains(n)
        {
            return Err(PolicyError::UnknownNode { node: n });
        }
        if let Some(mask) = policy.mask() {
            if mask.is_empty() {
                return Err(PolicyError::EmptyMask);
            }
            if let Some(bad) = mask.iter().find(|n| !topo.contains(*n)) {
                return Err(PolicyError::UnknownNode { node: bad });
            }
        }
        Ok(TaskPolicy {
            policy,
            socket_aware,
            il: IlState::new(),
            package: None,
            with_memory: None,
        })
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The interleave cursor.
    pub fn il_state(&self) -> IlState {
        self.il
    }

    /// Replaces the interleave cursor (to resume a task, or to test from a given state).
    pub fn set_il_state(&mut self, state: IlState) {
        self.il = state;
    }

    /// The interleave state as reported: (node that serves the next page, pages it still has
    /// this turn), for an allocation from `cpu_node`.
    pub fn il_report(&mut self, machine: &Machine<'_>, cpu_node: NodeId) -> Option<(NodeId, u8)> {
        let mask = self.candidates(machine, cpu_node, buddy_serves(machine, Order::ZERO))?;
        let il = self.il;
        Some(self.with_weights(machine, |w| il.normalised(&mask, w)))
    }

    /// Runs `f` with the weights this policy uses: the machine's table (held shared, so a
    /// concurrent replacement is seen whole or not at all) or 1 everywhere.
    fn with_weights<R>(&self, machine: &Machine<'_>, f: impl FnOnce(&Weights) -> R) -> R {
        match self.policy {
            Policy::WeightedInterleave(_) => machine.with_weights(f),
            _ => f(&Weights::default()),
        }
    }

    /// The mask the interleave runs over: with socket awareness, the policy's nodes in the
    /// package of `cpu_node` if any of them `serves` the request, else the whole mask.
    fn candidates(
        &mut self,
        machine: &Machine<'_>,
        cpu_node: NodeId,
        serves: impl Fn(NodeId) -> bool,
    ) -> Option<NodeMask> {
        let given = self.policy.mask()?;
        // Linux's policy nodes are the mask given ∩ N_MEMORY (`mpol_set_nodemask`): a node
        // without memory takes no turn. A mask without any node of memory keeps its nodes.
        let seq = machine.layout_count();
        let mask = match self.with_memory {
            Some((at, m)) if at == seq => m,
            _ => {
                let m = machine.with_memory(*given);
                self.with_memory = Some((seq, m));
                m
            }
        };
        let given = *given;
        if !self.socket_aware || !machine.topology().contains(cpu_node) {
            return Some(mask);
        }
        let local = match self.package {
            Some((cpu, m)) if cpu == cpu_node => m,
            _ => {
                let topo = machine.topology();
                // A node of no package shares none with anyone: no restriction to try.
                let m = match topo.package_of(cpu_node) {
                    Some(pkg) => NodeMask::from_nodes(
                        given.iter().filter(|n| topo.package_of(*n) == Some(pkg)),
                    ),
                    None => NodeMask::EMPTY,
                };
                self.package = Some((cpu_node, m));
                m
            }
        };
        Some(if local.iter().any(serves) {
            machine.with_memory(local)
        } else {
            mask
        })
    }

    /// Allocates one block under the policy, on behalf of a CPU of `cpu_node`.
    #[must_use = "dropping the frame leaks it"]
    pub fn alloc(
        &mut self,
        machine: &Machine<'_>,
        cpu_node: NodeId,
        order: Order,
        flags: AllocFlags,
    ) -> Option<Pfn> {
        self.alloc_by(
            machine,
            &Request::new(cpu_node, cpu_node, order, flags),
            buddy_serves(machine, order),
            |req| machine.walk(req),
        )
    }

    /// Takes a huge page of `size` from the pools under the policy (Linux's
    /// `alloc_hugetlb_folio` with a mempolicy): interleave picks the node, the others filter
    /// the zonelist walk over the pools.
    #[must_use = "dropping the page leaks it"]
    pub fn alloc_huge(
        &mut self,
        machine: &Machine<'_>,
        cpu_node: NodeId,
        size: HugeSize,
    ) -> Option<Pfn> {
        self.alloc_huge_with(machine, cpu_node, size, AllocFlags::empty())
    }

    /// [`TaskPolicy::alloc_huge`] with `flags`, which apply to the pools as in
    /// [`Machine::alloc_huge_with`].
    pub(crate) fn alloc_huge_with(
        &mut self,
        machine: &Machine<'_>,
        cpu_node: NodeId,
        size: HugeSize,
        flags: AllocFlags,
    ) -> Option<Pfn> {
        self.alloc_by(
            machine,
            &Request::new(cpu_node, cpu_node, size.order(), flags),
            // A package node serves a huge page while its pools have one free.
            |n| machine.huge_counts(n, size).free > 0,
            |req| machine.walk_pools(req, size),
        )
    }

    /// One block for `local` (a request preferring the CPU's node) under the policy, each try
    /// through `walk` (the buddy's walk or the pools'); `serves` says which nodes of a package
    /// can serve it, for socket-aware interleave.
    fn alloc_by(
        &mut self,
        machine: &Machine<'_>,
        local: &Request<'_>,
        serves: impl Fn(NodeId) -> bool,
        walk: impl Fn(&Request<'_>) -> Option<Pfn>,
    ) -> Option<Pfn> {
        let (cpu_node, order, flags) = (local.cpu_node, local.order, local.flags);
        match self.policy {
            Policy::Local => walk(local),
            Policy::Preferred(n) => walk(&Request::new(cpu_node, n, order, flags)),
            Policy::Bind(mask) => walk(&local.within(&mask)),
            Policy::PreferredMany(mask) => walk(&local.within(&mask)).or_else(|| walk(local)),
            Policy::Interleave(_) | Policy::WeightedInterleave(_) => {
                // A request refused before it takes anything leaves the cursor alone.
                if machine.refuses(flags) {
                    return None;
                }
                let mask = self.candidates(machine, cpu_node, serves)?;
                let mut il = self.il;
                let node = self.with_weights(machine, |w| il.next_node(&mask, w))?;
                self.il = il;
                walk(&Request::new(cpu_node, node, order, flags).interleaved())
            }
        }
    }

    /// Fills `out` with order-0 frames under the policy.
    ///
    /// Non-interleave policies make one node bulk call (two for `PreferredMany` when its mask
    /// runs short). Interleave policies make at most one per policy node; see the module doc
    /// for counts and state when memory runs short.
    pub fn alloc_bulk(
        &mut self,
        machine: &Machine<'_>,
        cpu_node: NodeId,
        flags: AllocFlags,
        out: &mut [Pfn],
    ) -> BulkResult {
        let mut r = BulkResult::default();
        let call = |r: &mut BulkResult,
                    preferred: NodeId,
                    filter: Option<&NodeMask>,
                    il: bool,
                    out: &mut [Pfn]| {
            r.node_calls += 1;
            let mut req = Request::new(cpu_node, preferred, Order::ZERO, flags);
            req.filter = filter;
            req.interleave = il;
            let got = machine.bulk_walk(&req, out);
            r.placed += got;
            got
        };
        match self.policy {
            Policy::Local => {
                call(&mut r, cpu_node, None, false, out);
            }
            Policy::Preferred(n) => {
                call(&mut r, n, None, false, out);
            }
            Policy::Bind(mask) => {
                call(&mut r, cpu_node, Some(&mask), false, out);
            }
            Policy::PreferredMany(mask) => {
                let got = call(&mut r, cpu_node, Some(&mask), false, out);
                if got < out.len() {
                    call(&mut r, cpu_node, None, false, &mut out[got..]);
                }
            }
            Policy::Interleave(_) | Policy::WeightedInterleave(_) => {
                // A request refused before it takes anything leaves the cursor alone.
                if machine.refuses(flags) {
                    return r;
                }
                let Some(mask) =
                    self.candidates(machine, cpu_node, buddy_serves(machine, Order::ZERO))
                else {
                    return r;
                };
                let mut il = self.il;
                let total = out.len() as u64;
                // One copy of the table serves the whole bulk, so it sees one table throughout
                // and never holds the weight lock while it allocates.
                let weights = self.with_weights(machine, Weights::clone);
                {
                    plan_bulk(&mut il, &mask, &weights, total, |node, count| {
                        // `count` sums to `total` over the emits, so the slice stays in bounds.
                        let start = r.placed;
                        let got = call(
                            &mut r,
                            node,
                            None,
                            true,
                            &mut out[start..start + count as usize],
                        );
                        debug_assert!(got <= count as usize);
                    });
                }
                self.il = il;
            }
        }
        r
    }
}

/// Whether node `n` of `machine` has free pages for a block of `order` above the min watermark
/// of one of its zones ([`Node::can_serve`](crate::Node::can_serve)): what makes a package node
/// a candidate for an allocation from the buddy.
fn buddy_serves(machine: &Machine<'_>, order: Order) -> impl Fn(NodeId) -> bool {
    move |n| machine.node(n).is_some_and(|node| node.can_serve(order))
}

/// Automatic weights from the topology's bandwidths (docs/interleave.md): `floor(32·bw/Σbw)`, at
/// least 1, divided by their gcd, over the nodes of `mask` that the topology gives memory (Linux
/// sums over `N_MEMORY`; a mask with none of them keeps all its nodes). A node outside those
/// weighs 1: a memoryless node of the mask, and also one that a hot-add gave memory after boot.
///
/// # Errors
/// [`PolicyError::MissingBandwidth`] if a node of those has no bandwidth, or the errors of
/// [`Weights::auto`].
pub fn auto_weights(topo: &Topology<'_>, mask: &NodeMask) -> Result<Weights, PolicyError> {
    if let Some(bad) = mask.iter().find(|n| !topo.contains(*n)) {
        return Err(PolicyError::UnknownNode { node: bad });
    }
    let mut bw = [None; crate::topology::MAX_NODES];
    for n in topo.node_ids() {
        bw[n.index()] = topo.info(n).bandwidth_gbps;
    }
    // The policy's nodes are the mask's nodes with memory (Linux sums over `N_MEMORY`); a mask
    // without any keeps its nodes, as the policy does.
    let with_memory = mask.and(&topo.memory_nodes());
    let set = if with_memory.is_empty() {
        *mask
    } else {
        with_memory
    };
    Weights::auto(&bw[..topo.len()], &set)
}
