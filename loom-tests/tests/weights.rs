//! The weighted-interleave weight table replaced (`Machine::set_weights`) while another thread
//! makes weighted-interleave allocations: a bulk is planned entirely under the old table or
//! entirely under the new one, never a mix, and each single page follows one table or the
//! other. A mix would place pages on nodes no table asked for.
#![cfg(numaframe_loom)]

use loom::sync::Arc;
use numaframe::interleave::{IlState, Weights, plan_bulk};
use numaframe::policy::{Policy, TaskPolicy};
use numaframe::{AllocFlags, Machine, NodeId, NodeMask, Order, Pfn};
use numaframe_loom::{Tiny, model, model_up_to, spawn};

/// Pages per node (0 and 1) of `frames`.
fn counts(m: &Machine<'_>, frames: &[Pfn]) -> [usize; 2] {
    let mut c = [0; 2];
    for &p in frames {
        c[m.node_of(p).expect("a frame of the machine").index()] += 1;
    }
    c
}

fn task(m: &Machine<'_>) -> TaskPolicy {
    TaskPolicy::new(m, Policy::WeightedInterleave(NodeMask::first_n(2)), false)
        .expect("valid policy")
}

/// One bulk of 3 pages by `task` on CPU node 0.
fn bulk(m: &Machine<'_>, task: &mut TaskPolicy) -> (Vec<Pfn>, usize) {
    let mut out = vec![Pfn::new(0); 3];
    let r = task.alloc_bulk(m, NodeId::new(0), AllocFlags::empty(), &mut out);
    assert_eq!(r.placed, 3, "the machine has room");
    (out, r.node_calls)
}

/// What two successive 3-page bulks of one fresh task give under tables `a` then `b`.
fn planned(a: &Weights, b: &Weights) -> [[usize; 2]; 2] {
    let mask = NodeMask::first_n(2);
    let mut state = IlState::new();
    let mut out = [[0; 2]; 2];
    for (i, w) in [a, b].into_iter().enumerate() {
        plan_bulk(&mut state, &mask, w, 3, |n, c| {
            out[i][n.index()] = c as usize
        });
    }
    out
}

/// Weights 1,2 give 3 fresh pages as 0, 1, 1 (1 and 2 pages); weights 2,1 give 0, 0, 1 (2 and
/// 1). Any mix of the two tables inside one plan gives something else (3 and 0, say). The
/// reader makes two bulks with one task: each is whole, and once it has seen the new table it
/// never sees the old one again (there is one writer).
///
/// At one preemption (8 s): three bulks of three pages over two nodes cost 198,791 executions
/// (200 s) at two.
#[test]
fn weight_replacement_is_seen_whole_by_each_bulk() {
    model_up_to(1, || {
        let m = Arc::new(Tiny::new(2, 64, &[]).boot_kept());
        let old = Weights::new(&[1, 2]).expect("weights");
        let new = Weights::new(&[2, 1]).expect("weights");
        m.set_weights(old.clone());

        // The replacing thread also allocates afterwards, with its own task: it must see the
        // table it just installed.
        let writer = {
            let (m, new) = (m.clone(), new.clone());
            spawn(move || {
                m.set_weights(new);
                bulk(&m, &mut task(&m))
            })
        };
        let reader = {
            let m = m.clone();
            spawn(move || {
                let mut t = task(&m);
                let first = bulk(&m, &mut t);
                let second = bulk(&m, &mut t);
                [first, second]
            })
        };
        let (mine, mine_calls) = writer.join().expect("writer");
        let theirs = reader.join().expect("reader");

        assert_eq!(counts(&m, &mine), [2, 1], "the writer's own bulk");
        assert_eq!(mine_calls, 2);
        let seen = [counts(&m, &theirs[0].0), counts(&m, &theirs[1].0)];
        let allowed = [
            planned(&old, &old),
            planned(&old, &new),
            planned(&new, &new),
        ];
        assert!(
            allowed.contains(&seen),
            "a bulk saw a mix of two weight tables, or the old one after the new: {seen:?}"
        );
        for (frames, calls) in &theirs {
            assert!(*calls <= 2);
            m.free_bulk(frames).expect("own frames");
        }
        m.free_bulk(&mine).expect("own frames");
        m.check_invariants().expect("invariants");
    });
}

/// The nodes `n` single pages of a fresh two-node weighted interleave take when the first
/// `switch` pages see `a` and the rest `b`: a transcription of the rule (a node keeps serving
/// while its turn lasts, then the next node serves `weight` pages, starting from node 0).
fn single_pages(a: [u8; 2], b: [u8; 2], switch: usize, n: usize) -> Vec<usize> {
    let (mut prev, mut left) = (1usize, 0u8);
    (0..n)
        .map(|i| {
            let w = if i < switch { a } else { b };
            if left == 0 {
                prev = (prev + 1) % 2;
                left = w[prev];
            }
            left -= 1;
            prev
        })
        .collect()
}

/// Single-page weighted interleave (`TaskPolicy::alloc`) while the table is replaced: each
/// page follows the old table or the new one, and once a page has seen the new one the next do
/// too. With weights 1,2 then 2,1, three pages go 0,1,1 under the old table and 0,0,1 under the
/// new; switching after the first page gives 0,1,0 and after the second 0,1,1.
#[test]
fn weight_replacement_is_seen_whole_by_each_page() {
    model(|| {
        let m = Arc::new(Tiny::new(2, 64, &[]).boot_kept());
        let (old, new) = ([1, 2], [2, 1]);
        m.set_weights(Weights::new(&old).expect("weights"));

        let writer = {
            let m = m.clone();
            spawn(move || m.set_weights(Weights::new(&new).expect("weights")))
        };
        let mut t = task(&m);
        let pages: Vec<Pfn> = (0..3)
            .map(|_| {
                t.alloc(&m, NodeId::new(0), Order::ZERO, AllocFlags::empty())
                    .expect("the machine has room")
            })
            .collect();
        writer.join().expect("writer");

        let seen: Vec<usize> = pages
            .iter()
            .map(|&p| m.node_of(p).expect("a frame of the machine").index())
            .collect();
        let allowed: Vec<Vec<usize>> = (0..=3).map(|k| single_pages(old, new, k, 3)).collect();
        assert!(
            allowed.contains(&seen),
            "pages followed neither table in order: {seen:?}, allowed {allowed:?}"
        );
        for p in pages {
            m.free(p, Order::ZERO).expect("own frame");
        }
        m.check_invariants().expect("invariants");
    });
}
