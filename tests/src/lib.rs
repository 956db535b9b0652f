//! Integration tests live in `tests/`, benchmarks in `benches/`. This library holds what both
//! share: the [`oracle`] (Linux's fallback-order scan, transcribed plainly) and [`topologies`], the
//! topologies they feed it.
#![warn(missing_docs, missing_debug_implementations)]

pub mod oracle {
    //! A straightforward O(N³) transcription of Linux's `build_zonelists()` and
    //! `find_next_best_node()` (`mm/page_alloc.c`, 6.7 and later), the oracle that numaframe's
    //! one-sort-per-node build is checked and benchmarked against.
    //!
    //! It deliberately shares nothing with `numaframe`: plain `usize` node ids, `bool` node
    //! states and a row-major `u8` distance table. Every distance is taken as it is, 255 (ACPI's
    //! "unreachable") included: the kernel has no rule for it. One switch is numaframe's, not
    //! the kernel's, and is marked where it applies: `linux_boot_order` treats every node as
    //! CPU-less, as the kernel's boot-time build sees them.

    /// Linux's `MAX_NUMNODES` with `CONFIG_NODES_SHIFT=10`.
    pub const MAX_NUMNODES: i64 = 1024;
    /// Linux's `PENALTY_FOR_NODE_WITH_CPUS`.
    pub const PENALTY_FOR_NODE_WITH_CPUS: i64 = 1;

    /// The inputs of a build: what the kernel reads from `node_distance()`,
    /// `node_state(n, N_MEMORY)` and `cpumask_of_node(n)`.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct Tables {
        /// Row-major, `n × n`: row `i` holds the distances from node `i`.
        pub distances: Vec<u8>,
        /// `has_cpus[n]`: `cpumask_of_node(n)` is not empty.
        pub has_cpus: Vec<bool>,
        /// `has_memory[n]`: `node_state(n, N_MEMORY)`.
        pub has_memory: Vec<bool>,
    }

    impl Tables {
        /// Number of nodes.
        pub fn len(&self) -> usize {
            self.has_cpus.len()
        }
        /// `true` for a table without nodes.
        pub fn is_empty(&self) -> bool {
            self.has_cpus.is_empty()
        }
        /// `node_distance(from, to)`.
        pub fn node_distance(&self, from: usize, to: usize) -> u8 {
            self.distances[from * self.len() + to]
        }
    }

    /// `find_next_best_node(node, used_node_mask)`: the next node of `node`'s fallback list,
    /// or `None` (`NUMA_NO_NODE`) when no candidate is left.
    pub fn find_next_best_node(
        t: &Tables,
        node: usize,
        used_node_mask: &mut [bool],
        node_load: &[i64],
        linux_boot_order: bool,
    ) -> Option<usize> {
        let mut min_val = i64::MAX;
        let mut best_node = None;

        // Use the local node if we haven't already, but for memoryless local node, we should
        // skip it and fall back to other nodes.
        if !used_node_mask[node] && t.has_memory[node] {
            used_node_mask[node] = true;
            return Some(node);
        }

        // for_each_node_state(n, N_MEMORY)
        for n in 0..t.len() {
            if !t.has_memory[n] {
                continue;
            }
            // Don't want a node to appear more than once.
            if used_node_mask[n] {
                continue;
            }

            // Use the distance array to find the distance.
            let mut val = i64::from(t.node_distance(node, n));

            // Penalize nodes under us ("prefer the next node").
            val += i64::from(n < node);

            // Give preference to headless and unused nodes. (numaframe: `linux_boot_order`
            // builds as Linux does at boot, before the node CPU masks are filled.)
            if t.has_cpus[n] && !linux_boot_order {
                val += PENALTY_FOR_NODE_WITH_CPUS;
            }

            // Slight preference for less loaded node.
            val *= MAX_NUMNODES;
            val += node_load[n];

            if val < min_val {
                min_val = val;
                best_node = Some(n);
            }
        }

        if let Some(b) = best_node {
            used_node_mask[b] = true;
        }
        best_node
    }

    /// `build_zonelists(pgdat)` for `local_node`: its fallback order, updating `node_load`.
    pub fn build_zonelists(
        t: &Tables,
        local_node: usize,
        node_load: &mut [i64],
        linux_boot_order: bool,
    ) -> Vec<usize> {
        let mut node_order = Vec::with_capacity(t.len());
        let mut used_mask = vec![false; t.len()];
        let mut prev_node = local_node;

        while let Some(node) =
            find_next_best_node(t, local_node, &mut used_mask, node_load, linux_boot_order)
        {
            // We don't want to pressure a particular node. So adding penalty to the first node
            // in same distance group to make it round-robin.
            if t.node_distance(local_node, node) != t.node_distance(local_node, prev_node) {
                node_load[node] += 1;
            }
            node_order.push(node);
            prev_node = node;
        }
        node_order
    }

    /// `__build_all_zonelists()`: `node_load[]` zeroed once, then every node in ascending id.
    /// Row `i` of the result is node `i`'s fallback order.
    pub fn build_all_zonelists(t: &Tables, linux_boot_order: bool) -> Vec<Vec<usize>> {
        let mut node_load = vec![0i64; t.len()];
        (0..t.len())
            .map(|nid| build_zonelists(t, nid, &mut node_load, linux_boot_order))
            .collect()
    }
}

pub mod topologies {
    //! Topologies for the oracle comparisons: a seeded random one and a realistic large one.

    use numaframe_testkit_base::Rng;

    use crate::oracle::Tables;

    /// Off-diagonal distances few enough to make ties common: 10 (as `numa=fake` builds), and
    /// 254 and 255 (ACPI's "unreachable"), so that a penalty of one makes them tie.
    pub const DISTANCES: [u8; 9] = [10, 11, 12, 16, 20, 21, 32, 254, 255];

    /// `n` nodes with distances drawn from [`DISTANCES`] (a symmetric table if `symmetric`),
    /// CPUs on about 70 % and memory on about 85 % of the nodes, at least one with memory.
    pub fn random(n: usize, symmetric: bool, seed: u64) -> Tables {
        let mut rng = Rng::new(seed);
        let mut distances = vec![0u8; n * n];
        for i in 0..n {
            for j in 0..n {
                distances[i * n + j] = if i == j {
                    10
                } else if symmetric && j < i {
                    distances[j * n + i]
                } else {
                    DISTANCES[rng.index(DISTANCES.len())]
                };
            }
        }
        let has_cpus = (0..n).map(|_| rng.chance(70)).collect();
        let mut has_memory: Vec<bool> = (0..n).map(|_| rng.chance(85)).collect();
        if !has_memory.contains(&true) {
            has_memory[rng.index(n)] = true;
        }
        Tables {
            distances,
            has_cpus,
            has_memory,
        }
    }

    /// A large machine laid out like real ones: `sockets` packages of `per_socket` nodes each.
    /// Distances are 10 local, 12 within a package, 20 to the other package of the same board
    /// (sockets `2k` and `2k+1`) and 32 beyond. In each package the last quarter of the nodes are
    /// CPU-less memory (CXL or HBM), and the second node of every eighth package is memoryless.
    pub fn sockets(sockets: usize, per_socket: usize) -> Tables {
        let n = sockets * per_socket;
        let socket = |i: usize| i / per_socket;
        let distances = (0..n * n)
            .map(|k| {
                let (i, j) = (k / n, k % n);
                if i == j {
                    10
                } else if socket(i) == socket(j) {
                    12
                } else if socket(i) / 2 == socket(j) / 2 {
                    20
                } else {
                    32
                }
            })
            .collect();
        let has_cpus = (0..n)
            .map(|i| i % per_socket < per_socket - per_socket / 4)
            .collect();
        let has_memory = (0..n)
            .map(|i| !(socket(i) % 8 == 0 && i % per_socket == 1))
            .collect();
        Tables {
            distances,
            has_cpus,
            has_memory,
        }
    }
}
