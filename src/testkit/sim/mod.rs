//! A simulated disk behind the I/O seam, for crash testing.
//!
//! [`SimStorage`] performs every operation on a real directory (so the engine's
//! `std::fs` reads keep working) and appends each mutation, with its bytes, to an
//! ordered trace. The trace separates the written image from the durable image:
//! - writes and length changes of a file become durable only through `sync_data` or
//!   `sync_all` of that file (a failed sync makes nothing durable, and what it should
//!   have covered is never covered by a later sync either: the kernel may have dropped
//!   it);
//! - creates, renames and removals of names become durable only through `sync_dir`
//!   of the directory that holds the name (both directories for a rename).
//!
//! From the trace and the initial image, [`Trace`] materialises any crash state: at
//! crash point `k` (after the first `k` operations) everything made durable before
//! `k` is applied, and any subset of the operations not yet durable may be applied
//! too; a write may be torn at 512-byte sectors. Directory operations persist either
//! in order ([`DirModel::InOrder`]) or in any order ([`DirModel::AnyOrder`]).
//!
//! The workload adds markers to the trace ([`SimStorage::mark`]) to say what it was
//! told (an acknowledged offset, a committed compaction) at that point.
//!
//! Simulated writes and syncs take no time, so threads that share a storage rarely
//! overlap on a machine with few cores; [`SimStorage::pause_after_writes`] makes each
//! write and file sync sleep briefly after it is recorded (outside any lock), so other
//! threads run in between.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::engine::storage::io::{RealStorage, Storage, StorageFile};

/// Sector size for torn writes.
pub const SECTOR: u64 = 512;

/// Identity of a file or directory (an inode). The root directory is 0.
pub type NodeId = u64;

/// One entry of the trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// A new name in `parent` for a new file or directory `id`.
    Create {
        parent: NodeId,
        name: String,
        id: NodeId,
        dir: bool,
    },
    /// Moves a name (replacing the target).
    Rename {
        from_parent: NodeId,
        from_name: String,
        to_parent: NodeId,
        to_name: String,
    },
    /// Removes a name (a file, or a directory with everything below it).
    Unlink { parent: NodeId, name: String },
    /// Writes bytes into a file.
    Write {
        id: NodeId,
        pos: u64,
        bytes: Vec<u8>,
    },
    /// Truncates or extends a file.
    SetLen { id: NodeId, len: u64 },
    /// A successful `sync_data` or `sync_all`.
    SyncFile { id: NodeId },
    /// A failed `sync_data` or `sync_all`: what it should have covered may be lost.
    SyncFailed { id: NodeId },
    /// A successful `sync_dir`.
    SyncDir { id: NodeId },
    /// A workload marker.
    Marker(u64),
}

impl Op {
    /// Whether the op changes the image (as opposed to syncs and markers).
    pub fn is_mutation(&self) -> bool {
        !matches!(
            self,
            Op::SyncFile { .. } | Op::SyncFailed { .. } | Op::SyncDir { .. } | Op::Marker(_)
        )
    }

    fn is_name_op(&self) -> bool {
        matches!(
            self,
            Op::Create { .. } | Op::Rename { .. } | Op::Unlink { .. }
        )
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Node {
    File(Vec<u8>),
    Dir(BTreeMap<String, NodeId>),
}

/// A file-system image: files and directories by id, names below the root (id 0).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Image {
    nodes: HashMap<NodeId, Node>,
}

impl Default for Image {
    fn default() -> Self {
        let mut nodes = HashMap::new();
        nodes.insert(0, Node::Dir(BTreeMap::new()));
        Image { nodes }
    }
}

/// How a not-yet-durable operation ends up in a crash state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// Lost.
    Skip,
    /// Persisted whole.
    Apply,
    /// A write of which only the sectors whose bit is set persisted (bit i: the i-th
    /// 512-byte-aligned piece of the write).
    Torn(u64),
}

impl Image {
    /// Reads a directory tree (files and directories; anything else is skipped).
    pub fn from_dir(root: &Path) -> io::Result<(Image, NodeId)> {
        let mut img = Image::default();
        let mut next = 1;
        img.load(root, 0, &mut next)?;
        Ok((img, next))
    }

    fn load(&mut self, dir: &Path, id: NodeId, next: &mut NodeId) -> io::Result<()> {
        let mut names = BTreeMap::new();
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            let ft = entry.file_type()?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let child = *next;
            if ft.is_dir() {
                *next += 1;
                self.load(&entry.path(), child, next)?;
            } else if ft.is_file() {
                *next += 1;
                self.nodes
                    .insert(child, Node::File(fs::read(entry.path())?));
            } else {
                continue;
            }
            names.insert(name, child);
        }
        self.nodes.insert(id, Node::Dir(names));
        Ok(())
    }

    /// Writes the image below `root` (which must not exist or be empty).
    pub fn write_to(&self, root: &Path) -> io::Result<()> {
        fs::create_dir_all(root)?;
        self.write_dir(0, root)
    }

    fn write_dir(&self, id: NodeId, path: &Path) -> io::Result<()> {
        let Some(Node::Dir(names)) = self.nodes.get(&id) else {
            return Ok(());
        };
        for (name, child) in names {
            let p = path.join(name);
            match self.nodes.get(child) {
                Some(Node::Dir(_)) => {
                    RealStorage.create_dir_all(&p)?;
                    self.write_dir(*child, &p)?;
                }
                Some(Node::File(bytes)) => {
                    let f = RealStorage.create(&p)?;
                    if !bytes.is_empty() {
                        f.write_at(bytes, 0)?;
                    }
                }
                None => {}
            }
        }
        Ok(())
    }

    /// A hash of what is reachable from the root (names and contents).
    pub fn digest(&self) -> u64 {
        let mut h = DefaultHasher::new();
        self.hash_dir(0, &mut h);
        h.finish()
    }

    fn hash_dir(&self, id: NodeId, h: &mut DefaultHasher) {
        match self.nodes.get(&id) {
            Some(Node::Dir(names)) => {
                names.len().hash(h);
                for (name, child) in names {
                    name.hash(h);
                    self.hash_dir(*child, h);
                }
            }
            Some(Node::File(bytes)) => {
                0xf1u8.hash(h);
                bytes.hash(h);
            }
            None => 0u8.hash(h),
        }
    }

    /// The id a path (relative to the root) names.
    pub fn lookup(&self, rel: &Path) -> Option<NodeId> {
        let mut id = 0;
        for c in rel.components() {
            match c {
                Component::Normal(n) => {
                    let Some(Node::Dir(names)) = self.nodes.get(&id) else {
                        return None;
                    };
                    id = *names.get(n.to_str()?)?;
                }
                Component::CurDir => {}
                _ => return None,
            }
        }
        Some(id)
    }

    /// The contents of the file at `rel`.
    pub fn file(&self, rel: &Path) -> Option<&[u8]> {
        match self.nodes.get(&self.lookup(rel)?) {
            Some(Node::File(b)) => Some(b),
            _ => None,
        }
    }

    fn dir_mut(&mut self, id: NodeId) -> Option<&mut BTreeMap<String, NodeId>> {
        match self.nodes.get_mut(&id) {
            Some(Node::Dir(names)) => Some(names),
            _ => None,
        }
    }

    fn file_mut(&mut self, id: NodeId) -> &mut Vec<u8> {
        let node = self
            .nodes
            .entry(id)
            .or_insert_with(|| Node::File(Vec::new()));
        if let Node::Dir(_) = node {
            *node = Node::File(Vec::new());
        }
        match node {
            Node::File(b) => b,
            Node::Dir(_) => unreachable!("replaced above"),
        }
    }

    /// Applies one op as chosen. Ops that no longer apply (a name that is not there,
    /// because an earlier op was lost) change nothing.
    pub fn apply(&mut self, op: &Op, choice: Choice) {
        if choice == Choice::Skip {
            return;
        }
        match op {
            Op::Create {
                parent,
                name,
                id,
                dir,
            } => {
                if !self.nodes.contains_key(id) {
                    let node = if *dir {
                        Node::Dir(BTreeMap::new())
                    } else {
                        Node::File(Vec::new())
                    };
                    self.nodes.insert(*id, node);
                }
                if let Some(names) = self.dir_mut(*parent) {
                    names.insert(name.clone(), *id);
                }
            }
            Op::Rename {
                from_parent,
                from_name,
                to_parent,
                to_name,
            } => {
                let Some(id) = self.dir_mut(*from_parent).and_then(|n| n.remove(from_name)) else {
                    return;
                };
                match self.dir_mut(*to_parent) {
                    Some(names) => {
                        names.insert(to_name.clone(), id);
                    }
                    None => {
                        // The target directory is not there: the name stays put.
                        if let Some(n) = self.dir_mut(*from_parent) {
                            n.insert(from_name.clone(), id);
                        }
                    }
                }
            }
            Op::Unlink { parent, name } => {
                if let Some(names) = self.dir_mut(*parent) {
                    names.remove(name);
                }
            }
            Op::Write { id, pos, bytes } => match choice {
                Choice::Torn(mask) => {
                    for (i, (at, piece)) in pieces(*pos, bytes).into_iter().enumerate() {
                        if i < 64 && mask & (1 << i) != 0 {
                            write_into(self.file_mut(*id), at, piece);
                        }
                    }
                }
                _ => write_into(self.file_mut(*id), *pos, bytes),
            },
            Op::SetLen { id, len } => {
                let f = self.file_mut(*id);
                f.resize(usize::try_from(*len).unwrap_or(usize::MAX), 0);
            }
            Op::SyncFile { .. } | Op::SyncFailed { .. } | Op::SyncDir { .. } | Op::Marker(_) => {}
        }
    }
}

/// The sector-aligned pieces of a write: (position, bytes).
fn pieces(pos: u64, bytes: &[u8]) -> Vec<(u64, &[u8])> {
    let mut out = Vec::new();
    let mut at = pos;
    let mut rest = bytes;
    while !rest.is_empty() {
        let room = SECTOR - at % SECTOR;
        let n = usize::try_from(room).unwrap_or(usize::MAX).min(rest.len());
        let (piece, tail) = rest.split_at(n);
        out.push((at, piece));
        at += n as u64;
        rest = tail;
    }
    out
}

/// Number of sector pieces a write has.
pub fn piece_count(op: &Op) -> usize {
    match op {
        Op::Write { pos, bytes, .. } => pieces(*pos, bytes).len(),
        _ => 0,
    }
}

fn write_into(file: &mut Vec<u8>, pos: u64, bytes: &[u8]) {
    let start = usize::try_from(pos).unwrap_or(usize::MAX);
    let end = start.saturating_add(bytes.len());
    if file.len() < end {
        file.resize(end, 0);
    }
    if let Some(dst) = file.get_mut(start..end) {
        dst.copy_from_slice(bytes);
    }
}

/// How directory operations that are not durable persist at a crash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirModel {
    /// In the order they were made (a prefix of them).
    InOrder,
    /// Any subset.
    AnyOrder,
}

/// A recorded run: the initial image (all durable) and the operations after it.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    pub initial: Image,
    pub ops: Vec<Op>,
}

/// Durability of every op of a trace.
#[derive(Clone, Debug)]
pub struct Durability {
    /// Index of the sync after which op i is durable (`usize::MAX`: never).
    durable_at: Vec<usize>,
}

impl Trace {
    /// When each op becomes durable.
    pub fn durability(&self) -> Durability {
        let n = self.ops.len();
        let mut durable_at = vec![usize::MAX; n];
        // Ops waiting for a file sync, by file; for a dir sync, by dir (with how many
        // dirs each still waits for).
        let mut file_wait: HashMap<NodeId, Vec<usize>> = HashMap::new();
        let mut dir_wait: HashMap<NodeId, Vec<usize>> = HashMap::new();
        let mut dirs_left: Vec<u8> = vec![0; n];
        for (i, op) in self.ops.iter().enumerate() {
            match op {
                Op::Write { id, .. } | Op::SetLen { id, .. } => {
                    file_wait.entry(*id).or_default().push(i);
                }
                Op::Create { parent, .. } | Op::Unlink { parent, .. } => {
                    dirs_left[i] = 1;
                    dir_wait.entry(*parent).or_default().push(i);
                }
                Op::Rename {
                    from_parent,
                    to_parent,
                    ..
                } => {
                    dir_wait.entry(*from_parent).or_default().push(i);
                    if from_parent == to_parent {
                        dirs_left[i] = 1;
                    } else {
                        dirs_left[i] = 2;
                        dir_wait.entry(*to_parent).or_default().push(i);
                    }
                }
                Op::SyncFile { id } => {
                    for j in file_wait.remove(id).unwrap_or_default() {
                        durable_at[j] = i;
                    }
                }
                Op::SyncFailed { id } => {
                    // Lost for good: no later sync covers them.
                    file_wait.remove(id);
                }
                Op::SyncDir { id } => {
                    for j in dir_wait.remove(id).unwrap_or_default() {
                        dirs_left[j] -= 1;
                        if dirs_left[j] == 0 {
                            durable_at[j] = i;
                        }
                    }
                }
                Op::Marker(_) => {}
            }
        }
        Durability { durable_at }
    }

    /// Markers among the first `k` ops.
    pub fn markers_before(&self, k: usize) -> Vec<u64> {
        self.ops
            .iter()
            .take(k)
            .filter_map(|op| match op {
                Op::Marker(m) => Some(*m),
                _ => None,
            })
            .collect()
    }

    /// The image after every op, all applied (the written image).
    pub fn written(&self) -> Image {
        let mut img = self.initial.clone();
        for op in &self.ops {
            img.apply(op, Choice::Apply);
        }
        img
    }
}

impl Durability {
    /// Mutations among the first `k` ops that are not durable at crash point `k`.
    pub fn pending(&self, trace: &Trace, k: usize) -> Vec<usize> {
        (0..k.min(trace.ops.len()))
            .filter(|&i| trace.ops.get(i).is_some_and(Op::is_mutation))
            .filter(|&i| self.durable_at.get(i).is_none_or(|&d| d >= k))
            .collect()
    }

    /// The largest `p <= k` such that every mutation below `p` is durable at `k`.
    pub fn settled(&self, trace: &Trace, k: usize) -> usize {
        (0..k.min(trace.ops.len()))
            .find(|&i| {
                trace.ops.get(i).is_some_and(Op::is_mutation)
                    && self.durable_at.get(i).is_none_or(|&d| d >= k)
            })
            .unwrap_or(k)
    }
}

/// Builds crash images of one trace at increasing crash points, keeping the image of
/// the settled prefix so each state applies only the ops after it.
#[derive(Debug)]
pub struct Materialiser<'t> {
    trace: &'t Trace,
    base: Image,
    base_at: usize,
}

impl<'t> Materialiser<'t> {
    pub fn new(trace: &'t Trace) -> Self {
        Materialiser {
            trace,
            base: trace.initial.clone(),
            base_at: 0,
        }
    }

    /// The crash image at point `k`: every durable op applied, and the `pending` ops
    /// (from [`Durability::pending`]) as `choices` says. Calls must come with
    /// non-decreasing `settled` values.
    pub fn image(
        &mut self,
        dur: &Durability,
        k: usize,
        pending: &[usize],
        choices: &[Choice],
    ) -> Image {
        let settled = dur.settled(self.trace, k);
        if settled < self.base_at {
            self.base = self.trace.initial.clone();
            self.base_at = 0;
        }
        for op in self.trace.ops.get(self.base_at..settled).unwrap_or(&[]) {
            self.base.apply(op, Choice::Apply);
        }
        self.base_at = settled;
        let mut img = self.base.clone();
        let mut next_pending = 0;
        for (i, op) in self.trace.ops.iter().enumerate().take(k).skip(settled) {
            let choice = if pending.get(next_pending) == Some(&i) {
                let c = choices.get(next_pending).copied().unwrap_or(Choice::Skip);
                next_pending += 1;
                c
            } else {
                Choice::Apply
            };
            img.apply(op, choice);
        }
        img
    }
}

/// A small deterministic random generator (xorshift64*), for sampled crash states.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// The choices that make up the crash states at one crash point.
///
/// Exhaustive when the states number at most `exhaustive_max`; else every in-order
/// prefix, every single omission, and `random` seeded random subsets (torn writes
/// included). Under [`DirModel::InOrder`] the name operations persist as a prefix.
pub fn crash_states(
    trace: &Trace,
    pending: &[usize],
    model: DirModel,
    exhaustive_max: usize,
    random: usize,
    rng: &mut Rng,
) -> Vec<Vec<Choice>> {
    let ops: Vec<&Op> = pending.iter().filter_map(|&i| trace.ops.get(i)).collect();
    // Options per op (name ops under InOrder are handled as one prefix length).
    let options = |op: &Op| -> Vec<Choice> {
        match op {
            Op::Write { .. } => {
                let n = piece_count(op).min(63);
                let mut v = vec![Choice::Skip, Choice::Apply];
                // Torn: each proper prefix of sectors, and all but the first.
                for m in 1..n {
                    v.push(Choice::Torn((1u64 << m) - 1));
                }
                if n >= 2 {
                    v.push(Choice::Torn(((1u64 << n) - 1) & !1));
                }
                v
            }
            _ => vec![Choice::Skip, Choice::Apply],
        }
    };
    let in_order = model == DirModel::InOrder;
    let name_idx: Vec<usize> = (0..ops.len())
        .filter(|&j| in_order && ops.get(j).is_some_and(|o| o.is_name_op()))
        .collect();
    let free: Vec<usize> = (0..ops.len()).filter(|j| !name_idx.contains(j)).collect();
    let free_opts: Vec<Vec<Choice>> = free
        .iter()
        .map(|&j| ops.get(j).map_or_else(Vec::new, |o| options(o)))
        .collect();
    let mut total: usize = name_idx.len() + 1;
    for o in &free_opts {
        total = total.saturating_mul(o.len());
    }
    let build = |prefix: usize, free_choice: &dyn Fn(usize) -> Choice| -> Vec<Choice> {
        let mut v = vec![Choice::Skip; ops.len()];
        for (n, &j) in name_idx.iter().enumerate() {
            if let Some(c) = v.get_mut(j) {
                *c = if n < prefix {
                    Choice::Apply
                } else {
                    Choice::Skip
                };
            }
        }
        for (f, &j) in free.iter().enumerate() {
            if let Some(c) = v.get_mut(j) {
                *c = free_choice(f);
            }
        }
        v
    };
    let mut out = Vec::new();
    if total <= exhaustive_max {
        for prefix in 0..=name_idx.len() {
            let mut digits = vec![0usize; free.len()];
            loop {
                out.push(build(prefix, &|f| {
                    free_opts
                        .get(f)
                        .and_then(|o| o.get(digits.get(f).copied().unwrap_or(0)))
                        .copied()
                        .unwrap_or(Choice::Skip)
                }));
                // Next mixed-radix number.
                let mut carry = true;
                for (f, d) in digits.iter_mut().enumerate() {
                    *d += 1;
                    if *d < free_opts.get(f).map_or(1, Vec::len) {
                        carry = false;
                        break;
                    }
                    *d = 0;
                }
                if carry {
                    break;
                }
            }
        }
        return out;
    }
    // In-order prefixes of all pending ops.
    for p in 0..=ops.len() {
        out.push(
            (0..ops.len())
                .map(|j| if j < p { Choice::Apply } else { Choice::Skip })
                .collect(),
        );
    }
    // Single omissions (name ops under InOrder: a missing one drops those after it).
    for skip in 0..ops.len() {
        let mut v = vec![Choice::Apply; ops.len()];
        let mut dropping = false;
        for (j, c) in v.iter_mut().enumerate() {
            if j == skip {
                dropping = in_order && name_idx.contains(&j);
                *c = Choice::Skip;
            } else if dropping && name_idx.contains(&j) {
                *c = Choice::Skip;
            }
        }
        out.push(v);
    }
    // Seeded random subsets, torn writes included.
    for _ in 0..random {
        let prefix = rng.below(name_idx.len() as u64 + 1) as usize;
        let picks: Vec<Choice> = free_opts
            .iter()
            .map(|o| {
                let r = rng.below(4);
                match (r, o.len()) {
                    (0, _) => Choice::Skip,
                    (1, n) if n > 2 => Choice::Torn(rng.next_u64()),
                    _ => Choice::Apply,
                }
            })
            .collect();
        out.push(build(prefix, &|f| {
            picks.get(f).copied().unwrap_or(Choice::Skip)
        }));
    }
    out
}

// ----- the storage -----

/// Fails a chosen sync.
#[derive(Debug, Default)]
struct FailPlan {
    /// Syncs (file and directory) made so far.
    syncs: u64,
    /// Fail sync number `n` (1-based); later ones succeed again.
    fail_sync: Option<u64>,
    failed: u64,
}

#[derive(Debug)]
struct State {
    live: Image,
    next_id: NodeId,
    trace: Trace,
    fail: FailPlan,
}

#[derive(Debug)]
struct Shared {
    root: PathBuf,
    state: Mutex<State>,
    /// Sleep after each write and file sync, in microseconds (0: none).
    pause_us: std::sync::atomic::AtomicU64,
}

/// A recording storage over a real directory: see the module documentation.
/// Clones share the trace.
#[derive(Debug, Clone)]
pub struct SimStorage {
    shared: Arc<Shared>,
}

fn other(msg: String) -> io::Error {
    io::Error::other(msg)
}

impl SimStorage {
    /// Starts recording over `root`, whose current contents are the initial (fully
    /// durable) image. Every path given to the storage must lie below `root`.
    pub fn new(root: &Path) -> io::Result<SimStorage> {
        fs::create_dir_all(root)?;
        let (initial, next_id) = Image::from_dir(root)?;
        Ok(SimStorage {
            shared: Arc::new(Shared {
                root: root.to_path_buf(),
                state: Mutex::new(State {
                    live: initial.clone(),
                    next_id,
                    trace: Trace {
                        initial,
                        ops: Vec::new(),
                    },
                    fail: FailPlan::default(),
                }),
                pause_us: std::sync::atomic::AtomicU64::new(0),
            }),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// From now on each write and file sync sleeps for `pause` after it is recorded,
    /// with no lock held, so threads sharing the storage interleave.
    pub fn pause_after_writes(&self, pause: std::time::Duration) {
        let us = u64::try_from(pause.as_micros()).unwrap_or(u64::MAX);
        self.shared
            .pause_us
            .store(us, std::sync::atomic::Ordering::Relaxed);
    }

    fn pause(&self) {
        let us = self
            .shared
            .pause_us
            .load(std::sync::atomic::Ordering::Relaxed);
        if us > 0 {
            std::thread::sleep(std::time::Duration::from_micros(us));
        }
    }

    /// Adds a workload marker at this point of the trace.
    pub fn mark(&self, marker: u64) {
        self.state().trace.ops.push(Op::Marker(marker));
    }

    /// A copy of the trace so far.
    pub fn trace(&self) -> Trace {
        self.state().trace.clone()
    }

    /// Number of ops recorded so far.
    pub fn len(&self) -> usize {
        self.state().trace.ops.len()
    }

    /// Whether nothing was recorded yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Makes sync number `n` from now (1-based, file and directory syncs counted)
    /// fail; the syncs after it succeed again.
    pub fn fail_sync_in(&self, n: u64) {
        let mut st = self.state();
        st.fail.fail_sync = Some(st.fail.syncs + n);
    }

    /// How many syncs failed.
    pub fn failed_syncs(&self) -> u64 {
        self.state().fail.failed
    }

    fn rel<'p>(&self, path: &'p Path) -> io::Result<&'p Path> {
        path.strip_prefix(&self.shared.root).map_err(|_| {
            other(format!(
                "{} is outside the simulated directory {}",
                path.display(),
                self.shared.root.display()
            ))
        })
    }

    /// (parent id, name) of a path in the live image.
    fn parent_of(st: &State, rel: &Path) -> io::Result<(NodeId, String)> {
        let name = rel
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| other(format!("{}: no file name", rel.display())))?;
        let parent = rel.parent().unwrap_or(Path::new(""));
        let id = st
            .live
            .lookup(parent)
            .ok_or_else(|| other(format!("{}: parent not in the image", rel.display())))?;
        Ok((id, name.to_string()))
    }

    fn record(st: &mut State, op: Op) {
        st.live.apply(&op, Choice::Apply);
        st.trace.ops.push(op);
    }

    /// Decides whether this sync fails.
    fn sync_fails(st: &mut State) -> bool {
        st.fail.syncs += 1;
        if st.fail.fail_sync == Some(st.fail.syncs) {
            st.fail.failed += 1;
            return true;
        }
        false
    }

    fn file(&self, id: NodeId, real: Box<dyn StorageFile>, path: &Path) -> Box<dyn StorageFile> {
        Box::new(SimFile {
            storage: self.clone(),
            id,
            real,
            path: path.to_path_buf(),
        })
    }
}

impl Storage for SimStorage {
    fn create(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        let rel = self.rel(path)?;
        let mut st = self.state();
        let (parent, name) = Self::parent_of(&st, rel)?;
        let real = RealStorage.create(path)?;
        let id = st.next_id;
        st.next_id += 1;
        Self::record(
            &mut st,
            Op::Create {
                parent,
                name,
                id,
                dir: false,
            },
        );
        drop(st);
        Ok(self.file(id, real, path))
    }

    fn open(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        let rel = self.rel(path)?;
        let st = self.state();
        let real = RealStorage.open(path)?;
        let id = st
            .live
            .lookup(rel)
            .ok_or_else(|| other(format!("{}: not in the simulated image", path.display())))?;
        drop(st);
        Ok(self.file(id, real, path))
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        let rel = self.rel(path)?.to_path_buf();
        let mut st = self.state();
        RealStorage.create_dir_all(path)?;
        let mut so_far = PathBuf::new();
        for c in rel.components() {
            let Component::Normal(n) = c else { continue };
            so_far.push(n);
            if st.live.lookup(&so_far).is_some() {
                continue;
            }
            let (parent, name) = Self::parent_of(&st, &so_far)?;
            let id = st.next_id;
            st.next_id += 1;
            Self::record(
                &mut st,
                Op::Create {
                    parent,
                    name,
                    id,
                    dir: true,
                },
            );
        }
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let (rf, rt) = (self.rel(from)?, self.rel(to)?);
        let mut st = self.state();
        let (from_parent, from_name) = Self::parent_of(&st, rf)?;
        let (to_parent, to_name) = Self::parent_of(&st, rt)?;
        RealStorage.rename(from, to)?;
        Self::record(
            &mut st,
            Op::Rename {
                from_parent,
                from_name,
                to_parent,
                to_name,
            },
        );
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let rel = self.rel(path)?;
        let mut st = self.state();
        let (parent, name) = Self::parent_of(&st, rel)?;
        RealStorage.remove_file(path)?;
        Self::record(&mut st, Op::Unlink { parent, name });
        Ok(())
    }

    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        let rel = self.rel(path)?;
        let mut st = self.state();
        let (parent, name) = Self::parent_of(&st, rel)?;
        RealStorage.remove_dir_all(path)?;
        Self::record(&mut st, Op::Unlink { parent, name });
        Ok(())
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        let Ok(rel) = self.rel(path) else {
            // Above the simulated directory: nothing recorded there.
            return Ok(());
        };
        let mut st = self.state();
        let id = st
            .live
            .lookup(rel)
            .ok_or_else(|| other(format!("{}: not in the simulated image", path.display())))?;
        if Self::sync_fails(&mut st) {
            return Err(other(format!("injected sync failure: {}", path.display())));
        }
        // No real fsync: durability is the trace's business.
        st.trace.ops.push(Op::SyncDir { id });
        Ok(())
    }
}

/// A file opened through [`SimStorage`].
#[derive(Debug)]
struct SimFile {
    storage: SimStorage,
    id: NodeId,
    real: Box<dyn StorageFile>,
    path: PathBuf,
}

impl SimFile {
    fn sync(&self) -> io::Result<()> {
        {
            let mut st = self.storage.state();
            if SimStorage::sync_fails(&mut st) {
                st.trace.ops.push(Op::SyncFailed { id: self.id });
                return Err(other(format!(
                    "injected sync failure: {}",
                    self.path.display()
                )));
            }
            st.trace.ops.push(Op::SyncFile { id: self.id });
        }
        self.storage.pause();
        Ok(())
    }
}

impl StorageFile for SimFile {
    fn write_at(&self, buf: &[u8], pos: u64) -> io::Result<()> {
        {
            let mut st = self.storage.state();
            self.real.write_at(buf, pos)?;
            SimStorage::record(
                &mut st,
                Op::Write {
                    id: self.id,
                    pos,
                    bytes: buf.to_vec(),
                },
            );
        }
        self.storage.pause();
        Ok(())
    }
    fn read_at(&self, buf: &mut [u8], pos: u64) -> io::Result<usize> {
        self.real.read_at(buf, pos)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut st = self.storage.state();
        self.real.set_len(len)?;
        SimStorage::record(&mut st, Op::SetLen { id: self.id, len });
        Ok(())
    }
    fn allocate(&self, _len: u64) -> io::Result<()> {
        // Reserving blocks changes no byte and no length.
        Ok(())
    }
    fn sync_data(&self) -> io::Result<()> {
        self.sync()
    }
    fn sync_all(&self) -> io::Result<()> {
        self.sync()
    }
    fn len(&self) -> io::Result<u64> {
        self.real.len()
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;
    use crate::engine::storage::io::write_file_atomic;

    #[test]
    fn the_written_image_is_the_real_directory() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("d");
        fs::create_dir_all(root.join("a")).unwrap();
        fs::write(root.join("a/old"), b"old").unwrap();
        let s = SimStorage::new(&root).unwrap();
        s.create_dir_all(&root.join("b/c")).unwrap();
        s.sync_dir(&root).unwrap();
        let f = s.create(&root.join("b/c/x")).unwrap();
        f.write_at(&[7u8; 1300], 100).unwrap();
        f.sync_data().unwrap();
        s.rename(&root.join("a/old"), &root.join("b/old")).unwrap();
        write_file_atomic(&s, &root.join("b"), "m.json", b"{}").unwrap();
        s.remove_dir_all(&root.join("a")).unwrap();
        let trace = s.trace();
        let (real, _) = Image::from_dir(&root).unwrap();
        assert_eq!(trace.written().digest(), real.digest());
        // Crash at the end with nothing pending applied: the write to x is durable
        // (synced) but its name is not (b/c never synced): x is gone; b/m.json is
        // there (b was synced by write_file_atomic), and so is b/c.
        let dur = trace.durability();
        let k = trace.ops.len();
        let pending = dur.pending(&trace, k);
        let mut m = Materialiser::new(&trace);
        let img = m.image(&dur, k, &pending, &vec![Choice::Skip; pending.len()]);
        assert_eq!(img.file(Path::new("b/m.json")), Some(&b"{}"[..]));
        // The rename needs both directories synced; a never was.
        assert_eq!(img.file(Path::new("a/old")), Some(&b"old"[..]));
        assert!(img.lookup(Path::new("b/old")).is_none());
        assert!(img.lookup(Path::new("b/c")).is_some());
        assert!(img.lookup(Path::new("b/c/x")).is_none());
        assert!(
            img.lookup(Path::new("a")).is_some(),
            "removal of a not durable"
        );
        // Torn: 1300 bytes at 100 are 4 pieces (412, 512, 376).
        assert_eq!(
            piece_count(&Op::Write {
                id: 1,
                pos: 100,
                bytes: vec![0; 1300]
            }),
            3
        );
        let states = crash_states(
            &trace,
            &pending,
            DirModel::AnyOrder,
            10_000,
            0,
            &mut Rng::new(1),
        );
        assert_eq!(states.len(), 1 << pending.len());
    }

    #[test]
    fn a_failed_sync_leaves_its_writes_uncovered_for_good() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("d");
        fs::create_dir_all(&root).unwrap();
        fs::write(root.join("f"), b"").unwrap();
        let s = SimStorage::new(&root).unwrap();
        let f = s.open(&root.join("f")).unwrap();
        f.write_at(b"one", 0).unwrap();
        s.fail_sync_in(1);
        assert!(f.sync_data().is_err());
        assert_eq!(s.failed_syncs(), 1);
        // The retry succeeds, yet what the failed sync should have covered is not
        // durable: only what is written after it is covered.
        f.sync_data().unwrap();
        f.write_at(b"two", 3).unwrap();
        f.sync_data().unwrap();
        let trace = s.trace();
        let dur = trace.durability();
        let k = trace.ops.len();
        let pending = dur.pending(&trace, k);
        assert_eq!(
            pending.len(),
            1,
            "the first write stays pending: {pending:?}"
        );
        let mut m = Materialiser::new(&trace);
        let lost = m.image(&dur, k, &pending, &[Choice::Skip]);
        assert_eq!(lost.file(Path::new("f")), Some(&b"\0\0\0two"[..]));
    }

    #[test]
    fn in_order_directory_changes_persist_as_a_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("d");
        let s = SimStorage::new(&root).unwrap();
        for name in ["a", "b", "c"] {
            drop(s.create(&root.join(name)).unwrap());
        }
        let trace = s.trace();
        let dur = trace.durability();
        let pending = dur.pending(&trace, 3);
        let mut rng = Rng::new(7);
        let in_order = crash_states(&trace, &pending, DirModel::InOrder, 100, 0, &mut rng);
        let any = crash_states(&trace, &pending, DirModel::AnyOrder, 100, 0, &mut rng);
        assert_eq!((in_order.len(), any.len()), (4, 8));
        let mut m = Materialiser::new(&trace);
        for c in &in_order {
            let img = m.image(&dur, 3, &pending, c);
            let names: Vec<bool> = ["a", "b", "c"]
                .iter()
                .map(|n| img.lookup(Path::new(n)).is_some())
                .collect();
            assert!(names.windows(2).all(|w| w[0] >= w[1]), "{names:?}");
        }
    }
}
