//! An oracle of occupancy-aware placement, written plainly: what a frame allocator that knows
//! how full every block is could keep free.
//!
//! - [`Oracle::blocks`]: a 4 KiB frame goes into the fullest 2 MiB block (fewest free frames)
//!   that has room, anywhere in memory; an order-9 request takes a fully free aligned block.
//! - [`Oracle::sections`]: the same within 1 GiB sections first: a 4 KiB frame or a 2 MiB
//!   block goes into the fullest section that can serve it (fewest free frames), and there into
//!   the fullest 2 MiB block with room; an order-18 request takes a fully free section. So
//!   small allocations pack into as few sections as possible.
//!
//! Within a block the lowest free frame is taken. Orders other than 0, 9 and 18 are refused.
#![deny(unsafe_code)]

use super::Frames;

/// Frames in a 2 MiB block.
const BLOCK: u64 = 512;
/// Frames in a 1 GiB section.
const SECTION: u64 = 1 << 18;

/// The blocks of one group (all memory, or one section), bucketed by their free frames.
#[derive(Clone, Debug)]
struct Buckets {
    /// `by_free[c]`: the blocks with `c` free frames, in no order.
    by_free: Vec<Vec<u32>>,
    /// Bit `c` set if `by_free[c]` is not empty.
    nonempty: [u64; 9],
    /// Free frames of the group.
    free: u64,
}

impl Buckets {
    fn new(blocks: impl Iterator<Item = u32>) -> Buckets {
        let mut b = Buckets {
            by_free: vec![Vec::new(); BLOCK as usize + 1],
            nonempty: [0; 9],
            free: 0,
        };
        for block in blocks {
            b.by_free[BLOCK as usize].push(block);
            b.free += BLOCK;
        }
        b.mark(BLOCK as usize);
        b
    }

    fn mark(&mut self, c: usize) {
        let bit = 1 << (c % 64);
        if self.by_free[c].is_empty() {
            self.nonempty[c / 64] &= !bit;
        } else {
            self.nonempty[c / 64] |= bit;
        }
    }

    /// The fewest free frames, at least 1, that a block of the group has.
    fn fullest_with_room(&self) -> Option<usize> {
        (0..9).find_map(|w| {
            let bits = if w == 0 {
                self.nonempty[0] & !1
            } else {
                self.nonempty[w]
            };
            (bits != 0).then(|| w * 64 + bits.trailing_zeros() as usize)
        })
    }

    fn has_free_block(&self) -> bool {
        !self.by_free[BLOCK as usize].is_empty()
    }
}

/// The oracle allocator over frames `0..frames` (a whole number of 2 MiB blocks).
#[derive(Clone, Debug)]
pub struct Oracle {
    /// Bit set: the frame is free.
    free: Vec<u64>,
    /// Free frames per block.
    block_free: Vec<u16>,
    /// Each block's index in its bucket.
    pos: Vec<u32>,
    /// One group ([`Oracle::blocks`]) or one per section ([`Oracle::sections`]).
    groups: Vec<Buckets>,
    /// Blocks per group.
    group_blocks: u64,
}

impl Oracle {
    /// The block-level oracle over `frames` frames.
    pub fn blocks(frames: u64) -> Oracle {
        Oracle::new(frames, frames / BLOCK)
    }

    /// The section-first oracle over `frames` frames (a whole number of sections).
    pub fn sections(frames: u64) -> Oracle {
        Oracle::new(frames, SECTION / BLOCK)
    }

    fn new(frames: u64, group_blocks: u64) -> Oracle {
        let blocks = frames / BLOCK;
        let group_blocks = group_blocks.max(1);
        let groups = (0..blocks.div_ceil(group_blocks))
            .map(|g| {
                let end = ((g + 1) * group_blocks).min(blocks);
                Buckets::new((g * group_blocks..end).map(|b| b as u32))
            })
            .collect();
        Oracle {
            free: vec![u64::MAX; (blocks * BLOCK / 64) as usize],
            block_free: vec![BLOCK as u16; blocks as usize],
            pos: (0..blocks)
                .map(|b| (b % group_blocks) as u32)
                .collect::<Vec<_>>(),
            groups,
            group_blocks,
        }
    }

    fn group_of(&self, block: u32) -> usize {
        (u64::from(block) / self.group_blocks) as usize
    }

    /// Moves `block` from the bucket of its old free count to that of `new`.
    fn set_block_free(&mut self, block: u32, new: u16) {
        let g = self.group_of(block);
        let old = self.block_free[block as usize] as usize;
        let group = &mut self.groups[g];
        let at = self.pos[block as usize] as usize;
        group.by_free[old].swap_remove(at);
        if let Some(&moved) = group.by_free[old].get(at) {
            self.pos[moved as usize] = at as u32;
        }
        group.mark(old);
        self.pos[block as usize] = group.by_free[new as usize].len() as u32;
        group.by_free[new as usize].push(block);
        group.mark(new as usize);
        group.free = group.free + u64::from(new) - old as u64;
        self.block_free[block as usize] = new;
    }

    /// The group a request is served from: the fullest (fewest free frames) that `can`
    /// serve it.
    fn fullest_group(&self, can: impl Fn(&Buckets) -> bool) -> Option<usize> {
        (0..self.groups.len())
            .filter(|&g| can(&self.groups[g]))
            .min_by_key(|&g| self.groups[g].free)
    }

    fn alloc_frame(&mut self) -> Option<u64> {
        let g = self.fullest_group(|b| b.free > 0)?;
        let c = self.groups[g].fullest_with_room()?;
        let block = *self.groups[g].by_free[c].last()?;
        let words = &mut self.free[block as usize * 8..block as usize * 8 + 8];
        let (w, word) = words.iter_mut().enumerate().find(|(_, x)| **x != 0)?;
        let bit = word.trailing_zeros() as u64;
        *word &= !(1 << bit);
        self.set_block_free(block, c as u16 - 1);
        Some(u64::from(block) * BLOCK + w as u64 * 64 + bit)
    }

    fn alloc_block(&mut self) -> Option<u64> {
        let g = self.fullest_group(Buckets::has_free_block)?;
        let block = *self.groups[g].by_free[BLOCK as usize].last()?;
        self.free[block as usize * 8..block as usize * 8 + 8].fill(0);
        self.set_block_free(block, 0);
        Some(u64::from(block) * BLOCK)
    }

    fn alloc_section(&mut self) -> Option<u64> {
        if self.group_blocks != SECTION / BLOCK {
            return None;
        }
        let g = (0..self.groups.len()).find(|&g| self.groups[g].free == SECTION)?;
        let first = g as u64 * self.group_blocks;
        for block in first..first + self.group_blocks {
            self.free[block as usize * 8..block as usize * 8 + 8].fill(0);
            self.set_block_free(block as u32, 0);
        }
        Some(first * BLOCK)
    }
}

impl Frames for Oracle {
    fn alloc(&mut self, order: u8) -> Option<u64> {
        match order {
            0 => self.alloc_frame(),
            9 => self.alloc_block(),
            18 => self.alloc_section(),
            _ => None,
        }
    }

    fn free(&mut self, frame: u64, order: u8) {
        let n = 1u64 << order;
        for f in frame..frame + n {
            self.free[(f / 64) as usize] |= 1 << (f % 64);
        }
        let first = frame / BLOCK;
        let last = (frame + n - 1) / BLOCK;
        for block in first..=last {
            let words = &self.free[block as usize * 8..block as usize * 8 + 8];
            let free: u32 = words.iter().map(|w| w.count_ones()).sum();
            self.set_block_free(block as u32, free as u16);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_fill_the_fullest_block_first() {
        let mut o = Oracle::blocks(4 * BLOCK);
        let a = o.alloc(0).unwrap();
        let b = o.alloc(0).unwrap();
        assert_eq!(
            b / BLOCK,
            a / BLOCK,
            "the second frame joins the first's block"
        );
        // Fill that block, free one frame in another block's worth: the next frame goes back
        // into the fullest block with room.
        let mut held = vec![a, b];
        while held.len() < BLOCK as usize + 1 {
            held.push(o.alloc(0).unwrap());
        }
        let other = held[BLOCK as usize];
        assert_ne!(other / BLOCK, a / BLOCK, "block 0 is full");
        o.free(a, 0);
        assert_eq!(
            o.alloc(0),
            Some(a),
            "one free frame: the fullest block with room"
        );
        let blk = o.alloc(9).unwrap() / BLOCK;
        assert!(
            blk != a / BLOCK && blk != other / BLOCK,
            "a fully free block"
        );
    }

    #[test]
    fn sections_keep_small_allocations_together() {
        let mut o = Oracle::sections(3 * SECTION);
        let small: Vec<u64> = (0..1000).map(|_| o.alloc(0).unwrap()).collect();
        let section = small[0] / SECTION;
        assert!(small.iter().all(|f| f / SECTION == section));
        let huge = o.alloc(18).unwrap();
        assert_ne!(huge / SECTION, section);
        let block = o.alloc(9).unwrap();
        assert_eq!(block / SECTION, section, "2 MiB from the fullest section");
        let other = o.alloc(18).unwrap();
        assert_eq!(o.alloc(18), None, "one section is split");
        o.free(other, 18);
        assert_eq!(o.alloc(18), Some(other));
        for f in small {
            o.free(f, 0);
        }
        o.free(block, 9);
        assert_eq!(o.alloc(18).map(|f| f / SECTION), Some(section));
    }
}
