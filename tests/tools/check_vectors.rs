//! The shared partition check on the golden vector partition.

use std::path::Path;

use seglog::engine::maintenance::check::{check_partition, CheckMode, IndexState};
use seglog::engine::storage::layout::{resolve, TargetKind};

#[test]
fn vector_partition_is_clean_in_both_modes() {
    let target = resolve(Path::new("tests/fixtures/vectors/partition")).unwrap();
    assert_eq!(target.kind, TargetKind::Partition);
    for mode in [CheckMode::Full, CheckMode::Quick] {
        let c = check_partition(&target.partitions[0], mode).unwrap();
        assert_eq!(
            c.severity(),
            None,
            "{mode:?}: {:?}",
            c.all_problems().collect::<Vec<_>>()
        );
        assert_eq!(c.segments.len(), 2);
        assert_eq!(c.segments[0].first_offset, Some(0));
        assert_eq!(c.segments[0].last_offset, Some(599));
        assert_eq!(c.segments[1].first_offset, Some(600));
        assert_eq!(c.segments[1].last_offset, Some(897));
        assert_eq!(c.next_offset(), Some(898));
        assert!(c.segments.iter().all(|s| s.index == IndexState::Valid));
        if mode == CheckMode::Quick {
            assert!(c.segments[0].trusted_by_index);
            assert!(
                !c.segments[1].trusted_by_index,
                "the active segment is always scanned"
            );
        } else {
            assert_eq!(c.segments[0].records, Some(600));
            assert_eq!(c.segments[1].records, Some(100));
        }
    }
}
