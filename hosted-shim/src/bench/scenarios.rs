//! The timed scenarios: [`visit`] builds every group of cells (one allocator in one scenario
//! each) over live machines and peers and hands them to a [`Visitor`].
#![deny(unsafe_code)]

use std::io;

use numaframe::interleave::Weights;
use numaframe::policy::{Policy, TaskPolicy};
use numaframe::{AllocFlags, BootOptions, NodeId, NodeMask, Order, Pfn};

use super::ops::{
    Sample, Timed, boot, bulk, fill_random_free, interleave, pairs, pairs_threads, repeat,
};
use super::{
    BULK, Bitmap, Buddy, FRAMES_1G, FRAMES_64G, Floor, Frames, FreeListPeer, INTERLEAVE_PAGES,
    Locked, NumaCpu, NumaHandle, NumaNode, NumaPolicy, OneNode, Padded, Rng, name, scenario,
    set_caches,
};
use crate::presets::preset;
use crate::sim::Sim;

/// One allocator in one scenario: `run(iters)` runs `iters` iterations and says what it timed.
pub struct Cell<'a> {
    /// The scenario (one of [`scenario::ALL`]).
    pub scenario: &'static str,
    /// The allocator (one of [`name`]).
    pub allocator: &'static str,
    /// Runs iterations.
    pub run: Box<dyn FnMut(u64) -> Sample + 'a>,
    /// Operations in one iteration (what `run` reports as `ops` per iteration).
    pub ops_per_iter: u64,
    /// One iteration takes seconds (a whole fill of 64 GiB, free-list's O(n²) random free):
    /// `numaframe bench` runs it once, without a warm-up run.
    pub once: bool,
    /// `--quick` and criterion (unless `NUMAFRAME_BENCH_SLOW=1`) leave the cell out.
    pub slow: bool,
}

impl Cell<'_> {
    fn per_iter(mut self, ops: u64) -> Self {
        self.ops_per_iter = ops;
        self
    }
    fn once(mut self, slow: bool) -> Self {
        self.once = true;
        self.slow = slow;
        self
    }
}

impl std::fmt::Debug for Cell<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cell")
            .field("scenario", &self.scenario)
            .field("allocator", &self.allocator)
            .field("ops_per_iter", &self.ops_per_iter)
            .field("once", &self.once)
            .field("slow", &self.slow)
            .finish_non_exhaustive()
    }
}

/// Cells measured together (their samples interleaved), under one title.
#[derive(Debug)]
pub struct Group<'a> {
    /// The group's title (the criterion group name).
    pub title: &'static str,
    /// An iteration is heavy (a whole fill, a boot, 1M pages): take few samples.
    pub heavy: bool,
    /// The cells.
    pub cells: Vec<Cell<'a>>,
}

/// Receives the groups of [`visit`] one by one, while their machines and peers are alive.
pub trait Visitor {
    /// Measures (or registers) the group's cells.
    ///
    /// # Errors
    /// Whatever the visitor's output fails with.
    fn group(&mut self, group: Group<'_>) -> io::Result<()>;
}

/// Sizes [`visit`] uses. Scenario names assume [`Sizes::FULL`]; smaller sizes serve tools that
/// cannot map 64 GiB (valgrind).
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    /// Frames of the peers' (and the small numaframe) memory.
    pub small: u64,
    /// Frames of numaframe's large memory.
    pub large: u64,
}

impl Sizes {
    /// 1 GiB and 64 GiB.
    pub const FULL: Sizes = Sizes {
        small: FRAMES_1G,
        large: FRAMES_64G,
    };
}

fn cell<'a>(
    scenario: &'static str,
    allocator: &'static str,
    run: impl FnMut(u64) -> Sample + 'a,
) -> Cell<'a> {
    Cell {
        scenario,
        allocator,
        run: Box::new(run),
        ops_per_iter: 1,
        once: false,
        slow: false,
    }
}

/// Builds every scenario and hands its groups to `v`.
///
/// # Errors
/// If simulated memory cannot be mapped, a machine does not boot, or `v` fails.
pub fn visit(sizes: Sizes, v: &mut dyn Visitor) -> io::Result<()> {
    use scenario::*;
    let n = sizes.small;
    let small = OneNode::new(n)?;
    let m = small.boot()?;
    let large = OneNode::new(sizes.large)?;
    let big = large.boot()?;

    // The peers, fresh for each group so that no group inherits another's fragmentation.
    let peers = || {
        (
            Buddy::new(n),
            Bitmap::<bitmap_allocator::BitAlloc1M>::new(n),
            FreeListPeer::new(n),
            Floor::new(n),
        )
    };

    // Hot order-0 pair.
    {
        let low = OneNode::at(n, 0)?;
        let lm = low.boot()?;
        let mut d0 = NumaCpu::new(&lm, 0);
        let (mut b, mut bm, mut fl, mut fo) = peers();
        let (mut c0, mut c1) = (NumaCpu::new(&m, 0), NumaCpu::new(&m, 0));
        let (mut g0, mut g1) = (NumaCpu::new(&big, 0), NumaCpu::new(&big, 0));
        let (m, big) = (&m, &big);
        v.group(Group {
            title: "pair",
            heavy: false,
            cells: vec![
                cell(PAIR_1G, name::NUMAFRAME, move |i| {
                    set_caches(m, true);
                    pairs(&mut c0, 0, i)
                }),
                cell(PAIR_1G, name::NUMAFRAME_NOCACHE, move |i| {
                    set_caches(m, false);
                    pairs(&mut c1, 0, i)
                }),
                cell(PAIR_1G, name::NUMAFRAME_HANDLE, move |i| {
                    set_caches(m, true);
                    pairs(&mut NumaHandle::claim(m, 0), 0, i)
                }),
                cell(PAIR_1G, name::NUMAFRAME_UNCHECKED, move |i| {
                    set_caches(m, true);
                    #[allow(unsafe_code)]
                    // SAFETY: `pairs` frees each frame it allocates once, right after.
                    let mut h = unsafe { NumaHandle::claim(m, 0).unchecked() };
                    pairs(&mut h, 0, i)
                }),
                cell(PAIR_1G, name::NUMAFRAME_DMA32, move |i| {
                    pairs(&mut d0, 0, i)
                }),
                cell(PAIR_1G, name::BUDDY, move |i| pairs(&mut b, 0, i)),
                cell(PAIR_1G, name::BITMAP, move |i| pairs(&mut bm, 0, i)),
                cell(PAIR_1G, name::FREE_LIST, move |i| pairs(&mut fl, 0, i)),
                cell(PAIR_1G, name::FLOOR, move |i| pairs(&mut fo, 0, i)),
                cell(PAIR_64G, name::NUMAFRAME, move |i| {
                    set_caches(big, true);
                    pairs(&mut g0, 0, i)
                }),
                cell(PAIR_64G, name::NUMAFRAME_NOCACHE, move |i| {
                    set_caches(big, false);
                    pairs(&mut g1, 0, i)
                }),
            ],
        })?;
    }

    // Fill everything, free in random order.
    {
        let (mut b, mut bm, mut fl, mut fo) = peers();
        let (mut c0, mut c1) = (NumaCpu::new(&m, 0), NumaCpu::new(&m, 0));
        let (mut g0, mut g1) = (NumaCpu::new(&big, 0), NumaCpu::new(&big, 0));
        let (m, big) = (&m, &big);
        // Watermarks are off, so a fill takes every managed frame but those the metadata
        // pool keeps for the planes of split pageblocks: 2 operations each.
        let (ops, big_ops) = (2 * fill_frames(m), 2 * fill_frames(big));
        let cells = vec![
            cell(FILL_1G, name::NUMAFRAME, {
                let mut f = fill(&mut c0, 1);
                move |i| {
                    set_caches(m, true);
                    f(i)
                }
            })
            .per_iter(ops),
            cell(FILL_1G, name::NUMAFRAME_NOCACHE, {
                let mut f = fill(&mut c1, 2);
                move |i| {
                    set_caches(m, false);
                    f(i)
                }
            })
            .per_iter(ops),
            cell(FILL_1G, name::NUMAFRAME_HANDLE, {
                let (mut held, mut rng) = (Vec::new(), Rng::new(9));
                move |i| {
                    set_caches(m, true);
                    let mut h = NumaHandle::claim(m, 0);
                    fill_random_free(&mut h, &mut held, &mut rng, i, Timed::Both)
                }
            })
            .per_iter(ops),
            cell(FILL_1G, name::BUDDY, fill(&mut b, 3)).per_iter(2 * n),
            cell(FILL_1G, name::BITMAP, fill(&mut bm, 4)).per_iter(2 * n),
            // free-list scans its whole range list on every free: O(n²) over a random order.
            cell(FILL_1G, name::FREE_LIST, fill(&mut fl, 5))
                .per_iter(2 * n)
                .once(true),
            cell(FILL_1G, name::FLOOR, fill(&mut fo, 6)).per_iter(2 * n),
            cell(FILL_64G, name::NUMAFRAME, {
                let mut f = fill(&mut g0, 7);
                move |i| {
                    set_caches(big, true);
                    f(i)
                }
            })
            .per_iter(big_ops)
            .once(false),
            cell(FILL_64G, name::NUMAFRAME_NOCACHE, {
                let mut f = fill(&mut g1, 8);
                move |i| {
                    set_caches(big, false);
                    f(i)
                }
            })
            .per_iter(big_ops)
            .once(true),
        ];
        v.group(Group {
            title: "fill+random-free",
            heavy: true,
            cells,
        })?;
    }

    // The random frees alone, after an untimed fill.
    {
        use scenario::RANDOM_FREE_1G;
        let (mut b, mut bm, mut fl, mut fo) = peers();
        let (mut c0, mut c1) = (NumaCpu::new(&m, 0), NumaCpu::new(&m, 0));
        let mut node = NumaNode::new(&m, NodeId::new(0), AllocFlags::empty());
        let m = &m;
        let frees = fill_frames(m);
        let cells = vec![
            cell(RANDOM_FREE_1G, name::NUMAFRAME, {
                let mut f = frees_of(&mut c0, 11);
                move |i| {
                    set_caches(m, true);
                    f(i)
                }
            })
            .per_iter(frees),
            cell(RANDOM_FREE_1G, name::NUMAFRAME_NOCACHE, {
                let mut f = frees_of(&mut c1, 12);
                move |i| {
                    set_caches(m, false);
                    f(i)
                }
            })
            .per_iter(frees),
            cell(RANDOM_FREE_1G, name::NUMAFRAME_HANDLE, {
                let (mut held, mut rng) = (Vec::new(), Rng::new(13));
                move |i| {
                    set_caches(m, true);
                    let mut h = NumaHandle::claim(m, 0);
                    fill_random_free(&mut h, &mut held, &mut rng, i, Timed::Frees)
                }
            })
            .per_iter(frees),
            cell(RANDOM_FREE_1G, name::NUMAFRAME_NODE, {
                let mut f = frees_of(&mut node, 14);
                move |i| {
                    set_caches(m, false);
                    f(i)
                }
            })
            .per_iter(frees),
            cell(RANDOM_FREE_1G, name::BUDDY, frees_of(&mut b, 15)).per_iter(n),
            cell(RANDOM_FREE_1G, name::BITMAP, frees_of(&mut bm, 16)).per_iter(n),
            cell(RANDOM_FREE_1G, name::FREE_LIST, frees_of(&mut fl, 17))
                .per_iter(n)
                .once(true),
            cell(RANDOM_FREE_1G, name::FLOOR, frees_of(&mut fo, 18)).per_iter(n),
        ];
        v.group(Group {
            title: "random free",
            heavy: true,
            cells,
        })?;
    }

    // Bulk of 512.
    {
        let (mut b, mut bm, mut fl, mut fo) = peers();
        set_caches(&m, true);
        let mut c = NumaCpu::new(&m, 0);
        let peers: [(&'static str, &mut dyn Frames); 5] = [
            (name::NUMAFRAME, &mut c),
            (name::BUDDY, &mut b),
            (name::BITMAP, &mut bm),
            (name::FREE_LIST, &mut fl),
            (name::FLOOR, &mut fo),
        ];
        // Each allocator serves both cells: the closures take turns through a RefCell.
        let shared: Vec<(&'static str, std::cell::RefCell<&mut dyn Frames>)> = peers
            .into_iter()
            .map(|(n, a)| (n, std::cell::RefCell::new(a)))
            .collect();
        let mut cells = Vec::new();
        for (scenario, time_alloc) in [(BULK_ALLOC, true), (BULK_FREE, false)] {
            for (allocator, a) in &shared {
                let mut out = vec![Pfn::new(0); BULK];
                cells.push(
                    cell(scenario, allocator, move |i| {
                        bulk(&mut **a.borrow_mut(), &mut out, time_alloc, i)
                    })
                    .per_iter(BULK as u64),
                );
            }
        }
        for (scenario, time_alloc) in [(BULK_ALLOC, true), (BULK_FREE, false)] {
            let mut out = vec![Pfn::new(0); BULK];
            let m = &m;
            cells.push(
                cell(scenario, name::NUMAFRAME_HANDLE, move |i| {
                    bulk(&mut NumaHandle::claim(m, 0), &mut out, time_alloc, i)
                })
                .per_iter(BULK as u64),
            );
        }
        v.group(Group {
            title: "bulk-512",
            heavy: false,
            cells,
        })?;
    }

    // 1, 2 and 4 threads: the caches on and off, the peers behind spin::Mutex.
    {
        let (b, bm, fl, fo) = peers();
        let (b, bm, fl, fo) = (
            spin::Mutex::new(b),
            spin::Mutex::new(bm),
            spin::Mutex::new(fl),
            spin::Mutex::new(fo),
        );
        let m = &m;
        // Each allocator's 1- and 2-thread cells run back to back in every round, the control
        // first, so that a round compares them under the same load.
        let rows = [(THREADS_1, 1usize), (THREADS_2, 2), (THREADS_4, 4)];
        let mut cells = Vec::new();
        // The control: each thread its own unlocked floor, nothing shared. Its scaling is
        // what this machine gives two threads at the moment (2 cores, other processes).
        for (scenario, threads) in rows {
            let mut own: Vec<Padded<Floor>> = (0..threads).map(|_| Padded(Floor::new(n))).collect();
            cells.push(
                cell(scenario, name::FLOOR_PER_THREAD, move |i| {
                    pairs_threads(&mut own, i)
                })
                .per_iter(threads as u64),
            );
        }
        for caches in [true, false] {
            let allocator = if caches {
                name::NUMAFRAME
            } else {
                name::NUMAFRAME_NOCACHE
            };
            for (scenario, threads) in rows {
                let mut handles: Vec<NumaCpu<'_, '_>> =
                    (0..threads).map(|t| NumaCpu::new(m, t)).collect();
                cells.push(
                    cell(scenario, allocator, move |i| {
                        set_caches(m, caches);
                        pairs_threads(&mut handles, i)
                    })
                    .per_iter(threads as u64),
                );
            }
        }
        for (scenario, threads) in rows {
            cells.push(
                cell(scenario, name::NUMAFRAME_HANDLE, move |i| {
                    set_caches(m, true);
                    let mut handles: Vec<NumaHandle<'_, '_>> =
                        (0..threads).map(|t| NumaHandle::claim(m, t)).collect();
                    pairs_threads(&mut handles, i)
                })
                .per_iter(threads as u64),
            );
        }
        // The node API: every thread through the zone lock, no per-CPU cache.
        for (scenario, threads) in rows {
            let mut nodes: Vec<NumaNode<'_, '_>> = (0..threads)
                .map(|_| NumaNode::new(m, NodeId::new(0), AllocFlags::empty()))
                .collect();
            cells.push(
                cell(scenario, name::NUMAFRAME_NODE, move |i| {
                    set_caches(m, true);
                    pairs_threads(&mut nodes, i)
                })
                .per_iter(threads as u64),
            );
        }
        for (scenario, threads) in rows {
            cells.push(locked_cell(scenario, name::BUDDY, &b, threads));
        }
        for (scenario, threads) in rows {
            cells.push(locked_cell(scenario, name::BITMAP, &bm, threads));
        }
        for (scenario, threads) in rows {
            cells.push(locked_cell(scenario, name::FREE_LIST, &fl, threads));
        }
        for (scenario, threads) in rows {
            cells.push(locked_cell(scenario, name::FLOOR, &fo, threads));
        }
        v.group(Group {
            title: "threads",
            heavy: false,
            cells,
        })?;
    }

    // Weighted interleave across the 4 nodes of cxl-2socket.
    {
        let spec = preset("cxl-2socket").ok_or_else(|| io::Error::other("preset cxl-2socket"))?;
        let sim = Sim::new(&spec)?;
        let wm = sim
            .boot(BootOptions::default())
            .map_err(|e| io::Error::other(format!("boot cxl-2socket: {e}")))?;
        wm.set_weights(Weights::new(&[3, 3, 1, 1]).map_err(|e| io::Error::other(e.to_string()))?);
        let wm = &wm;
        let policy = || {
            TaskPolicy::new(wm, Policy::WeightedInterleave(NodeMask::first_n(4)), false)
                .map_err(|e| io::Error::other(e.to_string()))
        };
        let (mut pb, mut ps) = (policy()?, policy()?);
        let (mut ob, mut os) = (
            vec![Pfn::new(0); INTERLEAVE_PAGES],
            vec![Pfn::new(0); INTERLEAVE_PAGES],
        );
        v.group(Group {
            title: "weighted-interleave",
            heavy: true,
            cells: vec![
                cell(INTERLEAVE, name::NUMAFRAME, move |i| {
                    interleave(wm, &mut pb, &mut ob, true, i)
                })
                .per_iter(INTERLEAVE_PAGES as u64),
                cell(INTERLEAVE, name::NUMAFRAME_SINGLES, move |i| {
                    interleave(wm, &mut ps, &mut os, false, i)
                })
                .per_iter(INTERLEAVE_PAGES as u64),
            ],
        })?;
    }

    // Order 9 and order 18, on machines of their own: "a fresh allocator", with no metadata of
    // earlier scenarios in its sections.
    {
        let (small, large) = (OneNode::new(n)?, OneNode::new(sizes.large)?);
        let (m, big) = (small.boot()?, large.boot()?);
        let mut cells = Vec::new();
        for (order, s1, s64) in [(9u8, ORDER9_1G, ORDER9_64G), (18, ORDER18_1G, ORDER18_64G)] {
            let (mut b, mut bm, mut fl, _) = peers();
            let (mut c, mut g) = (NumaCpu::new(&m, 0), NumaCpu::new(&big, 0));
            cells.push(cell(s1, name::NUMAFRAME, move |i| pairs(&mut c, order, i)));
            cells.push(cell(s1, name::BUDDY, move |i| pairs(&mut b, order, i)));
            cells.push(cell(s1, name::BITMAP, move |i| pairs(&mut bm, order, i)));
            cells.push(cell(s1, name::FREE_LIST, move |i| pairs(&mut fl, order, i)));
            cells.push(cell(s64, name::NUMAFRAME, move |i| pairs(&mut g, order, i)));
        }
        v.group(Group {
            title: "orders",
            heavy: false,
            cells,
        })?;
    }
    // Unmap the 64 GiB arena before the boot scenarios map 13 TiB more.
    drop(large);

    // Boot.
    {
        let mut cells = Vec::new();
        for (scenario, p) in [(BOOT_1T, "1tb-2node"), (BOOT_12T, "12tb-2node")] {
            let spec = preset(p).ok_or_else(|| io::Error::other(format!("preset {p}")))?;
            cells.push(cell(scenario, name::NUMAFRAME, move |i| {
                boot(&spec, i).expect("booting a preset")
            }));
        }
        v.group(Group {
            title: "boot",
            heavy: true,
            cells,
        })?;
    }

    // The zonelist hint on fake-64.
    hint(v)?;
    node_exact(v)?;
    zero_clean(v)?;
    repeat_group(v)
}

/// Zeroed order-0 pairs from clean memory next to plain ones, and with inline clearing.
fn zero_clean(v: &mut dyn Visitor) -> io::Result<()> {
    use scenario::ZERO_CLEAN;
    let nodes = [
        OneNode::exact(FRAMES_1G)?,
        OneNode::exact(FRAMES_1G)?,
        OneNode::exact(FRAMES_1G)?,
    ];
    let [a, b, c] = &nodes;
    let (ma, mb, mc) = (a.boot_zeroed()?, b.boot_zeroed()?, c.boot_zeroed()?);
    let n0 = NodeId::new(0);
    // The control frees clean as the ZERO cell does, so that the two differ in the flag only
    // (a dirty free costs more than a clean one).
    let mut plain = NumaNode::new(&ma, n0, AllocFlags::empty()).freeing_clean();
    let mut zero = NumaNode::new(&mb, n0, AllocFlags::ZERO).freeing_clean();
    let mut inline = NumaNode::new(&mc, n0, AllocFlags::ZERO);
    let cells = vec![
        cell(ZERO_CLEAN, name::NUMAFRAME_NODE, move |i| {
            pairs(&mut plain, 0, i)
        }),
        cell(ZERO_CLEAN, name::NUMAFRAME_NODE_ZERO, move |i| {
            pairs(&mut zero, 0, i)
        }),
        cell(ZERO_CLEAN, name::NUMAFRAME_NODE_ZERO_DIRTY, move |i| {
            pairs(&mut inline, 0, i)
        }),
    ];
    v.group(Group {
        title: "zeroed allocation",
        heavy: false,
        cells,
    })
}

/// Node-API pairs at orders 0, 9 and 18 on a node of exactly 1 GiB, next to the peers.
fn node_exact(v: &mut dyn Visitor) -> io::Result<()> {
    use scenario::*;
    let n = FRAMES_1G;
    let node = OneNode::exact(n)?;
    let m = node.boot()?;
    let mut cells = Vec::new();
    for (order, s) in [(0u8, NODE_ORDER0), (9, NODE_ORDER9), (18, NODE_ORDER18)] {
        let mut nf = NumaNode::new(&m, NodeId::new(0), AllocFlags::empty());
        let (mut b, mut bm, mut fl) = (
            Buddy::new(n),
            Bitmap::<bitmap_allocator::BitAlloc1M>::new(n),
            FreeListPeer::new(n),
        );
        cells.push(cell(s, name::NUMAFRAME_NODE, move |i| {
            pairs(&mut nf, order, i)
        }));
        cells.push(cell(s, name::BUDDY, move |i| pairs(&mut b, order, i)));
        cells.push(cell(s, name::BITMAP, move |i| pairs(&mut bm, order, i)));
        cells.push(cell(s, name::FREE_LIST, move |i| pairs(&mut fl, order, i)));
    }
    v.group(Group {
        title: "node API, exactly 1GiB",
        heavy: false,
        cells,
    })
}

/// LLFree's "rand" pattern on 1 GiB, memory full: every allocator full, then random free +
/// alloc.
fn repeat_group(v: &mut dyn Visitor) -> io::Result<()> {
    use scenario::REPEAT;
    let n = FRAMES_1G;
    let (cpu_node, node_node) = (OneNode::exact(n)?, OneNode::exact(n)?);
    let (cm, nm) = (cpu_node.boot()?, node_node.boot()?);
    let mut allocators: Vec<(&'static str, Box<dyn Frames + '_>)> = vec![
        (name::NUMAFRAME, Box::new(NumaCpu::new(&cm, 0))),
        (
            name::NUMAFRAME_NODE,
            Box::new(NumaNode::new(&nm, NodeId::new(0), AllocFlags::empty())),
        ),
        (name::BUDDY, Box::new(Buddy::new(n))),
        (
            name::BITMAP,
            Box::new(Bitmap::<bitmap_allocator::BitAlloc1M>::new(n)),
        ),
        (name::FREE_LIST, Box::new(FreeListPeer::new(n))),
        (name::FLOOR, Box::new(Floor::new(n))),
    ];
    let cells = allocators
        .drain(..)
        .enumerate()
        .map(|(k, (allocator, mut a))| {
            let mut held = Vec::new();
            let mut rng = Rng::new(0x7e9e_a700 + k as u64);
            cell(REPEAT, allocator, move |i| {
                repeat(&mut *a, &mut held, &mut rng, i)
            })
        })
        .collect();
    v.group(Group {
        title: "repeat",
        heavy: false,
        cells,
    })
}

/// Frames a fill of `m` takes (an untimed fill through CPU 0, freed again): every managed
/// frame but those its metadata pool keeps.
fn fill_frames(m: &numaframe::Machine<'_>) -> u64 {
    let mut c = NumaCpu::new(m, 0);
    let got: Vec<u64> = std::iter::from_fn(|| c.alloc(0)).collect();
    for &f in &got {
        c.free(f, 0);
    }
    got.len() as u64
}

fn fill<'a>(a: &'a mut dyn Frames, seed: u64) -> impl FnMut(u64) -> Sample + 'a {
    let mut held = Vec::new();
    let mut rng = Rng::new(seed);
    move |i| fill_random_free(a, &mut held, &mut rng, i, Timed::Both)
}

/// [`fill`] timing the frees alone.
fn frees_of<'a>(a: &'a mut dyn Frames, seed: u64) -> impl FnMut(u64) -> Sample + 'a {
    let mut held = Vec::new();
    let mut rng = Rng::new(seed);
    move |i| fill_random_free(a, &mut held, &mut rng, i, Timed::Frees)
}

fn locked_cell<'a, A: Frames + Send>(
    scenario: &'static str,
    allocator: &'static str,
    a: &'a spin::Mutex<A>,
    threads: usize,
) -> Cell<'a> {
    let mut handles: Vec<Locked<'a, A>> = (0..threads).map(|_| Locked(a)).collect();
    cell(scenario, allocator, move |i| pairs_threads(&mut handles, i)).per_iter(threads as u64)
}

/// On `fake-64` with the first 63 nodes of node 0's list exhausted, an order-0
/// allocation from node 0 against a local hit, against the same walk without the hint, and
/// against a THISNODE allocation on the 64th node.
fn hint(v: &mut dyn Visitor) -> io::Result<()> {
    use scenario::*;
    let spec = preset("fake-64").ok_or_else(|| io::Error::other("preset fake-64"))?;
    let sim = Sim::new(&spec)?;
    let m = sim
        .boot(BootOptions::default())
        .map_err(|e| io::Error::other(format!("boot fake-64: {e}")))?;
    let node0 = NodeId::new(0);
    let mut order = vec![NodeId::new(0); spec.len()];
    let len = m.fallback_order(node0, &mut order);
    if len != 64 {
        return Err(io::Error::other("fake-64: node 0's list has not 64 nodes"));
    }
    let mut local = NumaNode::new(&m, node0, AllocFlags::empty());
    v.group(Group {
        title: "fake-64 local",
        heavy: false,
        cells: vec![cell(HINT_LOCAL, name::NUMAFRAME, move |i| {
            pairs(&mut local, 0, i)
        })],
    })?;

    let mut held = Vec::new();
    for &node in &order[..63] {
        while let Some(p) = m.alloc(node, Order::ZERO, AllocFlags::THISNODE) {
            held.push(p);
        }
    }
    let last = order[63];
    let probe = m
        .alloc(node0, Order::ZERO, AllocFlags::empty())
        .ok_or_else(|| io::Error::other("fake-64: the 64th node is empty"))?;
    if m.node_of(probe) != Some(last) {
        return Err(io::Error::other(
            "fake-64: the walk did not reach the 64th node",
        ));
    }
    m.free(probe, Order::ZERO)
        .map_err(|e| io::Error::other(e.to_string()))?;
    let mut hinted = NumaNode::new(&m, node0, AllocFlags::empty());
    let mut full = NumaPolicy::new(
        &m,
        TaskPolicy::new(&m, Policy::Bind(NodeMask::first_n(64)), false)
            .map_err(|e| io::Error::other(e.to_string()))?,
        node0,
    );
    let mut thisnode = NumaNode::new(&m, last, AllocFlags::THISNODE);
    v.group(Group {
        title: "fake-64 exhausted",
        heavy: false,
        cells: vec![
            cell(HINT_SKIP, name::NUMAFRAME, move |i| {
                pairs(&mut hinted, 0, i)
            }),
            cell(HINT_NONE, name::NUMAFRAME, move |i| pairs(&mut full, 0, i)),
            cell(HINT_THISNODE, name::NUMAFRAME, move |i| {
                pairs(&mut thisnode, 0, i)
            }),
        ],
    })?;
    m.free_bulk(&held)
        .map_err(|e| io::Error::other(e.to_string()))?;
    Ok(())
}

#[cfg(test)]
mod honesty {
    use super::*;
    use numaframe::ZoneKind;

    /// `describe(NODE_ORDER0)`: the first pair splits the 1 GiB block; the pageblock then
    /// stays split as the class's spare (docs/architecture.md), so later pairs do not merge it.
    #[test]
    fn node_order0_pair_splits_its_1gib_block_once() {
        let node = OneNode::exact(FRAMES_1G).unwrap();
        let m = node.boot().unwrap();
        let zone = m.nodes().get(0).unwrap().zone(ZoneKind::Normal);
        assert_eq!(zone.buddyinfo()[18], 1, "fresh: one whole 1 GiB block");
        let mut nf = NumaNode::new(&m, NodeId::new(0), AllocFlags::empty());
        let f = nf.alloc(0).unwrap();
        let split = zone.buddyinfo()[18];
        nf.free(f, 0);
        let merged = zone.buddyinfo()[18];
        pairs(&mut nf, 0, 1000);
        let after = zone.buddyinfo()[18];
        assert_eq!(
            (split, merged, after),
            (0, 0, 0),
            "order-18 blocks: during a pair, after one pair, after 1000 pairs"
        );
    }

    /// Criterion's throughput of a cell is its `ops_per_iter`; the runner divides by the
    /// sample's `ops`. Both must count the same operations. Scenarios.rs: "Watermarks are
    /// off, so a fill takes every managed frame: 2 operations each."
    struct Divisors(Vec<(&'static str, &'static str, u64, u64)>);
    impl Visitor for Divisors {
        fn group(&mut self, group: Group<'_>) -> io::Result<()> {
            if group.title != "fill+random-free" && group.title != "random free" {
                return Ok(());
            }
            for mut c in group.cells {
                if c.allocator.starts_with(name::NUMAFRAME) && !c.scenario.contains("64GiB") {
                    let s = (c.run)(1);
                    self.0
                        .push((c.scenario, c.allocator, s.ops, c.ops_per_iter));
                }
            }
            Ok(())
        }
    }

    #[test]
    fn fill_cells_count_the_operations_they_time() {
        let mut d = Divisors(Vec::new());
        visit(Sizes::FULL, &mut d).unwrap();
        assert!(!d.0.is_empty());
        let wrong: Vec<_> = d.0.iter().filter(|x| x.2 != x.3).collect();
        assert!(
            wrong.is_empty(),
            "(scenario, allocator, ops of one iteration, ops_per_iter): {wrong:?}"
        );
    }
}
