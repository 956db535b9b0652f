//! Memory offlining, the zone's half.
#![deny(unsafe_code)]

use super::FreeArea;
use crate::error::InvariantError;
use crate::topology::NodeId;

impl FreeArea {
    /// Checks the metadata pool's owner index against the planes: every pageblock with planes
    /// is the owner of their slot, and every slot in use of the pool's listed slabs names the
    /// pageblock whose planes it holds.
    pub(super) fn check_owners(&self, node: NodeId) -> Result<(), InvariantError> {
        if !self.meta.owners_consistent() {
            return Err(InvariantError::Counter { node });
        }
        let mut bad = None;
        self.for_each_pb_of_split(|r, _| {
            if bad.is_none() && !self.meta.owner_agrees(r) {
                bad = Some(self.pb_base(r));
            }
        });
        match bad {
            Some(pfn) => Err(InvariantError::Pageblock { pfn }),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::test_util::{SparseMem, Spec, n};
    use crate::*;

    #[test]
    fn the_invariant_walk_finds_planes_their_owner_index_does_not_name() {
        let spec = Spec::uniform(1, 4 * 512, 0);
        let mem = SparseMem::default();
        let m = spec.boot(&mem);
        let a = m.alloc(n(0), Order::ZERO, AllocFlags::empty()).unwrap();
        let b = m.alloc(n(0), Order::ZERO, AllocFlags::SHORT_LIVED).unwrap();
        assert_ne!(a.get() >> 9, b.get() >> 9, "two classes, two pageblocks");
        m.check_invariants().unwrap();
        let zone = m.node(n(0)).unwrap().zone(ZoneKind::Dma32);
        let swap = || {
            zone.with_area(|area| {
                let (ra, rb) = (area.pb_ref(a).unwrap(), area.pb_ref(b).unwrap());
                area.meta.swap_planes(ra, rb);
            });
        };
        swap();
        assert!(matches!(
            m.check_invariants(),
            Err(InvariantError::Pageblock { .. } | InvariantError::Counter { .. })
        ));
        swap();
        m.check_invariants().unwrap();
        m.free(a, Order::ZERO).unwrap();
        m.free(b, Order::ZERO).unwrap();
        m.check_invariants().unwrap();
    }
}
