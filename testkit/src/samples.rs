//! Topology files that more than one test reads, as the tools print them.

/// `numactl -H` of a two-node machine: node 0 with CPUs 0-3 and 15950 MB (12000 MB free), node
/// 1 CPU-less and memoryless, distance 21 between them.
pub const NUMACTL_TWO_NODES: &str = "available: 2 nodes (0-1)
node 0 cpus: 0 1 2 3
node 0 size: 15950 MB
node 0 free: 12000 MB
node 1 cpus:
node 1 size: 0 MB
node 1 free: 0 MB
node distances:
node   0   1
  0:  10  21
  1:  21  10
";
