//! The huge-page pools at run time: `alloc_huge`, `free_huge` and `release_huge` racing on one
//! node's 2 MiB pool. A pool page is in exactly one place (free in the pool, handed out, or
//! back in the buddy after a release), so in every interleaving a page is never handed out
//! twice, a double `free_huge` has exactly one winner, and afterwards the pool's counts and the
//! zone's free pages add up to the node's memory.
#![cfg(numaframe_loom)]

use loom::sync::Arc;
use numaframe::{FreeError, HugeSize, Machine, NodeId, Pfn};
use numaframe_loom::{Tiny, model, spawn};

const N0: NodeId = NodeId::new(0);
const SIZE: HugeSize = HugeSize::Size2M;
/// Frames of a 2 MiB page.
const PAGE_FRAMES: u64 = 512;

/// One node of 2048 frames (three whole 2 MiB blocks once its metadata and the machine's
/// tables are carved off) with `pages` pages reserved in its pool.
fn setup(pages: u64) -> Arc<Machine<'static>> {
    let m = Tiny::new(1, 2048, &[]).boot_kept();
    assert_eq!(m.reserve_huge(N0, SIZE, pages), pages);
    Arc::new(m)
}

/// Checks that the pool holds `total` pages, all free, that the zone holds everything else,
/// and the invariants.
fn settle(m: &Machine<'_>, total: u64) {
    let pool = m.huge_counts(N0, SIZE);
    assert_eq!((pool.total, pool.free), (total, total), "{pool:?}");
    let node = m.node(N0).expect("node 0");
    assert_eq!(
        node.free_pages() + PAGE_FRAMES * total,
        node.managed_pages()
    );
    m.check_invariants().expect("invariants");
}

/// One thread takes the pool's only page and gives it back while another shrinks the pool by
/// one page. The release gets the page only while it is free in the pool; if it got it first,
/// the allocation finds the pool empty.
#[test]
fn alloc_and_free_race_release() {
    model(|| {
        let m = setup(1);
        let user = {
            let m = m.clone();
            spawn(move || {
                let p = m.alloc_huge(N0, SIZE)?;
                m.free_huge(p, SIZE).expect("own page");
                Some(p)
            })
        };
        let released = m.release_huge(N0, SIZE, 1);
        let used = user.join().expect("user");
        assert!(released <= 1);
        assert!(
            used.is_some() || released == 1,
            "the allocation failed although the page was in the pool"
        );
        settle(&m, 1 - released);
    });
}

/// Two threads allocate from a pool of one page: exactly one gets it.
#[test]
fn two_allocations_share_one_page() {
    model(|| {
        let m = setup(1);
        let other = {
            let m = m.clone();
            spawn(move || m.alloc_huge(N0, SIZE))
        };
        let mine = m.alloc_huge(N0, SIZE);
        let theirs = other.join().expect("thread");
        let Some(p) = mine.xor(theirs) else {
            panic!("exactly one allocation gets the page: {mine:?} {theirs:?}");
        };
        assert_eq!(m.huge_counts(N0, SIZE).free, 0);
        m.free_huge(p, SIZE).expect("own page");
        settle(&m, 1);
    });
}

/// Two threads free the same pool page (a caller's double free) while the second also shrinks
/// the pool: exactly one free wins, the loser gets a typed error naming the page, and the page
/// ends up free in the pool or, if the release ran after the winning free, back in the buddy.
#[test]
fn double_free_huge_races_release() {
    model(|| {
        let m = setup(1);
        let p = m.alloc_huge(N0, SIZE).expect("a pool page");
        let other = {
            let m = m.clone();
            spawn(move || {
                let freed = m.free_huge(p, SIZE);
                (freed, m.release_huge(N0, SIZE, 1))
            })
        };
        let mine = m.free_huge(p, SIZE);
        let (theirs, released) = other.join().expect("thread");
        assert!(
            mine.is_ok() != theirs.is_ok(),
            "exactly one free wins: {mine:?} {theirs:?}"
        );
        let err = mine.err().or(theirs.err()).expect("one error");
        let named = |pfn: Pfn| pfn == p;
        assert!(
            matches!(err, FreeError::DoubleFree { pfn } | FreeError::NotAllocated { pfn } if named(pfn)),
            "{err:?}"
        );
        assert!(released <= 1);
        settle(&m, 1 - released);
    });
}
