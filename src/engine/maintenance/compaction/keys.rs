//! The key table of compaction's first pass: 24-byte slots of a 127-bit key digest and
//! the offset of the key's newest record; no key bytes are kept, so memory is bounded
//! by the number of distinct keys, not their size.

use super::*;

/// A 128-bit digest of a key: two SipHash-1-3 values under different random keys.
/// The low bit of the second word is forced to 1 so an all-zero slot means empty
/// (127 bits of digest remain).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct KeyDigest(pub(super) [u64; 2]);

pub(super) struct Digester {
    pub(super) a: RandomState,
    pub(super) b: RandomState,
}

impl Digester {
    pub(super) fn new() -> Self {
        // Each RandomState gets its own SipHash key.
        Digester {
            a: RandomState::new(),
            b: RandomState::new(),
        }
    }
    pub(super) fn digest(&self, key: &[u8]) -> KeyDigest {
        KeyDigest([self.a.hash_one(key), self.b.hash_one(key) | 1])
    }
}

/// One slot of the key table: 24 bytes.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Slot {
    pub(super) digest: [u64; 2],
    pub(super) value: u64,
}

const _: () = assert!(std::mem::size_of::<Slot>() == 24);

/// Open addressing with linear probing over `Slot`s, at most 3/4 full: the key map of
/// pass 1. A table of our own (rather than `HashMap`) keeps a slot in one array, so
/// the batched passes can prefetch it before they need it: at a million keys and
/// more, nearly every lookup is a cache miss, and overlapping them is most of the
/// speed.
pub(super) struct KeyTable {
    pub(super) slots: Vec<Slot>,
    pub(super) len: usize,
}

impl KeyTable {
    const INITIAL_SLOTS: usize = 1024;

    pub(super) fn new() -> Self {
        KeyTable {
            slots: vec![Slot::default(); Self::INITIAL_SLOTS],
            len: 0,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn home(&self, d: &KeyDigest) -> usize {
        // The length is a power of two.
        (d.0[0] as usize) & (self.slots.len() - 1)
    }

    /// Asks the CPU to start loading the slot `d` starts probing at.
    #[inline]
    #[cfg_attr(
        target_arch = "x86_64",
        expect(unsafe_code, reason = "the prefetch intrinsic is unsafe to call")
    )]
    pub(super) fn prefetch(&self, d: &KeyDigest) {
        #[cfg(target_arch = "x86_64")]
        if let Some(slot) = self.slots.get(self.home(d)) {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let p = std::ptr::from_ref::<Slot>(slot).cast::<i8>();
            // SAFETY: a prefetch is a hint: it never faults and changes nothing
            // observable; `p` and `p + 23` lie inside the slot.
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(p);
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(std::mem::size_of::<Slot>() - 1));
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = d;
    }

    pub(super) fn find(&self, d: &KeyDigest) -> usize {
        let mask = self.slots.len() - 1;
        let mut i = self.home(d);
        loop {
            match self.slots.get(i) {
                Some(s) if s.digest == d.0 || s.digest[1] == 0 => return i,
                Some(_) => i = (i + 1) & mask,
                None => unreachable!("slot index is masked to the table"),
            }
        }
    }

    pub(super) fn get(&self, d: &KeyDigest) -> Option<u64> {
        let s = self.slots.get(self.find(d))?;
        (s.digest[1] != 0).then_some(s.value)
    }

    /// Sets `d`'s value; returns the previous one.
    pub(super) fn insert(&mut self, d: KeyDigest, value: u64) -> Option<u64> {
        if (self.len + 1) * 4 > self.slots.len() * 3 {
            self.grow();
        }
        let i = self.find(&d);
        let slot = self.slots.get_mut(i)?;
        if slot.digest[1] == 0 {
            *slot = Slot { digest: d.0, value };
            self.len += 1;
            None
        } else {
            Some(std::mem::replace(&mut slot.value, value))
        }
    }

    pub(super) fn grow(&mut self) {
        let doubled = vec![Slot::default(); self.slots.len() * 2];
        let old = std::mem::replace(&mut self.slots, doubled);
        for s in old.into_iter().filter(|s| s.digest[1] != 0) {
            let i = self.find(&KeyDigest(s.digest));
            if let Some(slot) = self.slots.get_mut(i) {
                *slot = s;
            }
        }
    }
}
