//! A simulated disk for redb: bytes in memory that a crash rolls back to the last `sync_data`.
//!
//! This is the harshest crash a real disk allows short of corruption: every write after the
//! last fsync is lost (a power cut with a volatile cache), so the cluster store's durability
//! contract — `append`, `save_vote` and `apply` return only after an immediate commit — is what
//! keeps P8 true across crashes here. A crash also bumps the disk's generation: the crashed
//! incarnation's handles fail every later call (a dead process writes nothing).
//!
//! A power cut can also land inside a write (`--torn-sectors`): a volume armed with
//! [`Volume::arm_cut`] lets its next Raft log write land and then fails every later write,
//! resize and sync of the volume (the process is gone), and its crash keeps a random subset of
//! that write's 512-byte sectors — any subset, in any order, as a disk that reorders its cache
//! may. A crash of an unarmed volume happens between writes, as before.

use std::sync::{Arc, Mutex};

use palisade_cluster::raft_log::LogFile;
use palisade_sim::SplitMix64;
use redb::StorageBackend;

/// The unit a disk writes atomically: a power cut keeps or loses each whole sector.
pub const SECTOR_BYTES: usize = 512;

/// What redb's backend methods fail with.
type BackendIoError = std::io::Error;

#[derive(Debug, Default)]
struct State {
    /// The bytes as the running process sees them.
    data: Vec<u8>,
    /// How to undo every write since the last sync, oldest first.
    undo: Vec<Undo>,
    generation: u64,
    syncs: u64,
    /// A planted bug: `sync_data` returns without making anything durable.
    lies: bool,
    /// The disk is full: every write, resize and sync fails from now on.
    full: bool,
    /// The write a power cut landed in (where, and its bytes), kept in part by the crash.
    torn: Option<(usize, Vec<u8>)>,
}

/// A power cut timed to land inside a Raft log write, shared by the disks of one volume.
#[derive(Debug, Default)]
struct Cut {
    /// The next Raft log write is the last thing the process does.
    armed: bool,
    /// It happened: every later change to the volume fails.
    landed: bool,
}

/// What a crash did to a write it landed in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tear {
    /// Sectors the write spanned.
    pub sectors: usize,
    /// Of those, the sectors the disk kept.
    pub kept: usize,
    /// A sector was lost before one that was kept (what the old Raft log read as damage).
    pub out_of_order: bool,
}

#[derive(Debug)]
enum Undo {
    /// Bytes at `offset` before a write.
    Bytes { offset: usize, old: Vec<u8> },
    /// The length before a `set_len`, and the bytes a shrink cut off.
    Len { len: usize, cut: Vec<u8> },
}

/// One member's disk; clones share it.
#[derive(Debug, Clone, Default)]
pub struct Disk {
    state: Arc<Mutex<State>>,
    /// The power cut of the volume this disk belongs to.
    cut: Arc<Mutex<Cut>>,
}

impl Disk {
    /// A disk whose fsync is a no-op (a planted bug: a crash loses everything the crashed
    /// incarnation wrote, acknowledged or not).
    pub fn lying() -> Self {
        let disk = Self::default();
        disk.state.lock().expect("not poisoned").lies = true;
        disk
    }

    /// A backend for the next incarnation of the member: the only live one.
    pub fn open(&self) -> DiskHandle {
        let generation = self.state.lock().expect("not poisoned").generation;
        DiskHandle {
            disk: self.clone(),
            generation,
        }
    }

    /// Power cut: writes since the last sync are lost; open handles go dead.
    pub fn crash(&self) {
        let mut state = self.state.lock().expect("not poisoned");
        while let Some(undo) = state.undo.pop() {
            match undo {
                Undo::Bytes { offset, old } => {
                    state.data[offset..offset + old.len()].copy_from_slice(&old);
                }
                Undo::Len { len, cut } => {
                    state.data.truncate(len);
                    state.data.extend_from_slice(&cut);
                }
            }
        }
        state.generation += 1;
    }

    /// A copy of what the disk durably holds now (`cp -a` of a stopped member's directory): a
    /// disk of its own.
    pub fn copy(&self) -> Self {
        let state = self.state.lock().expect("not poisoned");
        let mut data = state.data.clone();
        // Undo what is not synced: the copy holds what survives a power cut.
        for undo in state.undo.iter().rev() {
            match undo {
                Undo::Bytes { offset, old } => {
                    data[*offset..*offset + old.len()].copy_from_slice(old);
                }
                Undo::Len { len, cut } => {
                    data.truncate(*len);
                    data.extend_from_slice(cut);
                }
            }
        }
        Self {
            state: Arc::new(Mutex::new(State {
                data,
                lies: state.lies,
                ..State::default()
            })),
            cut: Arc::default(),
        }
    }

    /// After [`Self::crash`]: keeps a random subset of the sectors of the write the power cut
    /// landed in (drawn from `rng`), durably. `None` when no cut landed in this disk.
    fn keep_torn_sectors(&self, rng: &mut SplitMix64) -> Option<Tear> {
        let mut state = self.state.lock().expect("not poisoned");
        let (offset, bytes) = state.torn.take()?;
        let end = offset + bytes.len();
        let first = offset / SECTOR_BYTES;
        let sectors = (end - 1) / SECTOR_BYTES + 1 - first;
        // Now and then all or none, else each sector on its own.
        let mode = rng.range(0, 8);
        let kept: Vec<bool> = (0..sectors)
            .map(|_| match mode {
                0 => false,
                1 => true,
                _ => rng.chance(50),
            })
            .collect();
        for (i, _) in kept.iter().enumerate().filter(|(_, keep)| **keep) {
            let from = ((first + i) * SECTOR_BYTES).max(offset);
            let to = ((first + i + 1) * SECTOR_BYTES).min(end);
            if state.data.len() < to {
                state.data.resize(to, 0);
            }
            state.data[from..to].copy_from_slice(&bytes[from - offset..to - offset]);
        }
        let out_of_order = kept.windows(2).any(|pair| !pair[0] && pair[1]);
        Some(Tear {
            sectors,
            kept: kept.iter().filter(|k| **k).count(),
            out_of_order,
        })
    }

    /// The disk fills up: from now on every write, resize and sync fails (reads still work).
    pub fn fill(&self) {
        self.state.lock().expect("not poisoned").full = true;
    }

    /// fsyncs so far.
    pub fn syncs(&self) -> u64 {
        self.state.lock().expect("not poisoned").syncs
    }
}

/// A redb backend on a [`Disk`], valid until the disk's next crash.
#[derive(Debug)]
pub struct DiskHandle {
    disk: Disk,
    generation: u64,
}

impl DiskHandle {
    /// The disk's state, for a change: fails when the disk is full.
    fn state_mut(&self) -> Result<std::sync::MutexGuard<'_, State>, BackendIoError> {
        let state = self.state()?;
        if state.full {
            return Err(std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                "no space left on device (simulated)",
            ));
        }
        Ok(state)
    }

    fn state(&self) -> Result<std::sync::MutexGuard<'_, State>, BackendIoError> {
        if self.disk.cut.lock().expect("not poisoned").landed {
            return Err(std::io::Error::other(
                "the power went out in a write: this disk handle is dead",
            ));
        }
        let state = self.disk.state.lock().expect("not poisoned");
        if state.generation != self.generation {
            return Err(std::io::Error::other(
                "the process crashed: this disk handle is dead",
            ));
        }
        Ok(state)
    }
}

fn offset(offset: u64) -> Result<usize, BackendIoError> {
    usize::try_from(offset).map_err(|_| std::io::Error::other("offset out of range"))
}

impl StorageBackend for DiskHandle {
    fn len(&self) -> Result<u64, BackendIoError> {
        Ok(self.state()?.data.len() as u64)
    }

    fn read(&self, at: u64, out: &mut [u8]) -> Result<(), BackendIoError> {
        let state = self.state()?;
        let at = offset(at)?;
        let bytes = state.data.get(at..at + out.len()).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "read past the end")
        })?;
        out.copy_from_slice(bytes);
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), BackendIoError> {
        let mut state = self.state_mut()?;
        let len = offset(len)?;
        let before = state.data.len();
        let cut = state
            .data
            .get(len..)
            .map(<[u8]>::to_vec)
            .unwrap_or_default();
        state.undo.push(Undo::Len { len: before, cut });
        state.data.resize(len, 0);
        Ok(())
    }

    fn sync_data(&self) -> Result<(), BackendIoError> {
        let mut state = self.state_mut()?;
        if !state.lies {
            state.undo.clear();
        }
        state.syncs += 1;
        Ok(())
    }

    fn write(&self, at: u64, data: &[u8]) -> Result<(), BackendIoError> {
        let mut state = self.state_mut()?;
        let at = offset(at)?;
        let end = at + data.len();
        if end > state.data.len() {
            return Err(std::io::Error::other("write past the end (set_len first)"));
        }
        let old = state.data[at..end].to_vec();
        state.undo.push(Undo::Bytes { offset: at, old });
        state.data[at..end].copy_from_slice(data);
        Ok(())
    }
}

/// The Raft log's view of the same simulated file: a write past the end extends it (as a
/// file's does), and every change is undone by a crash unless synced.
impl LogFile for DiskHandle {
    fn len(&self) -> std::io::Result<u64> {
        StorageBackend::len(self)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        StorageBackend::read(self, offset, out)
    }

    fn write(&self, at: u64, data: &[u8]) -> std::io::Result<()> {
        let end = at + data.len() as u64;
        if end > StorageBackend::len(self)? {
            StorageBackend::set_len(self, end)?;
        }
        StorageBackend::write(self, at, data)?;
        let mut cut = self.disk.cut.lock().expect("not poisoned");
        if cut.armed {
            // The power goes out while this write is in the disk's cache: the crash keeps
            // some of its sectors, and nothing after it reaches any disk of the volume.
            cut.landed = true;
            self.disk.state.lock().expect("not poisoned").torn = Some((offset(at)?, data.to_vec()));
        }
        Ok(())
    }

    fn set_len(&self, len: u64) -> std::io::Result<()> {
        StorageBackend::set_len(self, len)
    }

    fn sync_data(&self) -> std::io::Result<()> {
        StorageBackend::sync_data(self)
    }

    fn blocks(&self) -> bool {
        // Memory: inline, so that a seed's order of events is the same every run.
        false
    }
}

/// A member's volume: its store (redb) and its two Raft log files, which crash, copy, fill
/// and lie together.
#[derive(Debug, Clone)]
pub struct Volume {
    store: Disk,
    logs: [Disk; 2],
}

impl Default for Volume {
    fn default() -> Self {
        Self::of([Disk::default(), Disk::default(), Disk::default()])
    }
}

impl Volume {
    /// A volume of these disks (store, log files), sharing one power cut.
    fn of([store, first, second]: [Disk; 3]) -> Self {
        let cut = Arc::new(Mutex::new(Cut::default()));
        let share = |disk: Disk| Disk {
            cut: cut.clone(),
            ..disk
        };
        Self {
            store: share(store),
            logs: [share(first), share(second)],
        }
    }

    /// A volume whose fsyncs are all no-ops (a planted bug).
    pub fn lying() -> Self {
        Self::of([Disk::lying(), Disk::lying(), Disk::lying()])
    }

    /// Times the next power cut to land inside the next Raft log write (see the module).
    pub fn arm_cut(&self) {
        self.store.cut.lock().expect("not poisoned").armed = true;
    }

    /// Whether an armed power cut has landed in a write.
    pub fn cut_landed(&self) -> bool {
        self.store.cut.lock().expect("not poisoned").landed
    }

    fn disks(&self) -> [&Disk; 3] {
        [&self.store, &self.logs[0], &self.logs[1]]
    }

    /// The next incarnation's store backend and log files.
    pub fn open(&self) -> (DiskHandle, [Box<dyn LogFile>; 2]) {
        (
            self.store.open(),
            [Box::new(self.logs[0].open()), Box::new(self.logs[1].open())],
        )
    }

    /// Power cut: every file loses its writes since its last sync. With `torn` (some bytes),
    /// each log file also ends in that many bytes of an append that was cut midway — on disk,
    /// never acknowledged (a real power cut can leave part of a write).
    /// A power cut that landed in a write ([`Self::arm_cut`]) keeps a subset of its sectors
    /// drawn from `rng` (and no torn bytes are added to that file): what it did, if it landed.
    pub fn crash(&self, torn: Option<Vec<u8>>, rng: &mut SplitMix64) -> Option<Tear> {
        for disk in self.disks() {
            disk.crash();
        }
        *self.store.cut.lock().expect("not poisoned") = Cut::default();
        let mut tear = None;
        for log in &self.logs {
            tear = tear.or(log.keep_torn_sectors(rng));
        }
        if let Some(bytes) = torn.filter(|_| tear.is_none()) {
            for log in &self.logs {
                let handle = log.open();
                let end = StorageBackend::len(&handle).unwrap_or(0);
                // An empty file was never used: a torn append needs a log before it.
                if end > 0 && LogFile::write(&handle, end, &bytes).is_ok() {
                    let _ = StorageBackend::sync_data(&handle);
                }
            }
        }
        if tear.is_some() {
            for log in &self.logs {
                let _ = StorageBackend::sync_data(&log.open());
            }
        }
        tear
    }

    /// A copy of what the volume durably holds now (`cp -a` of a stopped member's directory).
    pub fn copy(&self) -> Self {
        Self::of([self.store.copy(), self.logs[0].copy(), self.logs[1].copy()])
    }

    /// The volume fills up.
    pub fn fill(&self) {
        for disk in self.disks() {
            disk.fill();
        }
    }

    /// fsyncs so far.
    pub fn syncs(&self) -> u64 {
        self.disks().iter().map(|d| d.syncs()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::{Disk, Volume};
    use redb::StorageBackend as _;

    #[test]
    fn a_crash_loses_exactly_the_writes_after_the_last_sync() {
        let disk = Disk::default();
        let handle = disk.open();
        handle.set_len(8).unwrap();
        handle.write(0, b"abcd").unwrap();
        handle.sync_data().unwrap();
        handle.write(2, b"XY").unwrap();
        handle.set_len(16).unwrap();
        handle.write(12, b"zz").unwrap();
        disk.crash();
        assert!(handle.len().is_err(), "the crashed incarnation is dead");
        let next = disk.open();
        assert_eq!(next.len().unwrap(), 8);
        let mut out = [0; 4];
        next.read(0, &mut out).unwrap();
        assert_eq!(&out, b"abcd");
    }

    #[test]
    fn a_shrink_after_the_last_sync_is_undone() {
        let disk = Disk::default();
        let handle = disk.open();
        handle.set_len(6).unwrap();
        handle.write(0, b"abcdef").unwrap();
        handle.sync_data().unwrap();
        handle.set_len(2).unwrap();
        disk.crash();
        let next = disk.open();
        let mut out = [0; 6];
        next.read(0, &mut out).unwrap();
        assert_eq!(&out, b"abcdef");
    }

    #[test]
    fn redb_reopens_after_a_crash_with_every_synced_commit() {
        use redb::{Database, Durability, ReadableDatabase, TableDefinition};
        const T: TableDefinition<u64, u64> = TableDefinition::new("t");
        let disk = Disk::default();
        {
            let db = Database::builder()
                .create_with_backend(disk.open())
                .unwrap();
            for i in 0..20 {
                let mut txn = db.begin_write().unwrap();
                if i == 19 {
                    txn.set_durability(Durability::None).unwrap();
                }
                txn.open_table(T).unwrap().insert(i, i * 10).unwrap();
                txn.commit().unwrap();
            }
            disk.crash();
        }
        let db = Database::builder()
            .create_with_backend(disk.open())
            .unwrap();
        let txn = db.begin_read().unwrap();
        let table = txn.open_table(T).unwrap();
        for i in 0..19 {
            assert_eq!(table.get(i).unwrap().unwrap().value(), i * 10);
        }
        assert!(table.get(19).unwrap().is_none(), "not synced, so lost");
    }

    #[test]
    fn a_full_disk_refuses_changes_but_still_reads() {
        let disk = Disk::default();
        let handle = disk.open();
        handle.set_len(4).unwrap();
        handle.write(0, b"abcd").unwrap();
        disk.fill();
        let error = handle.write(0, b"x").unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::StorageFull);
        assert!(handle.sync_data().is_err() && handle.set_len(8).is_err());
        let mut out = [0; 4];
        handle.read(0, &mut out).unwrap();
        assert_eq!(&out, b"abcd");
    }

    #[test]
    fn a_lying_disk_loses_synced_writes_too() {
        let disk = Disk::lying();
        let handle = disk.open();
        handle.set_len(4).unwrap();
        handle.write(0, b"abcd").unwrap();
        handle.sync_data().unwrap();
        disk.crash();
        assert_eq!(disk.open().len().unwrap(), 0);
    }

    #[test]
    fn a_volume_crashes_and_copies_its_log_files_with_its_store() {
        use palisade_cluster::raft_log::LogFile;
        let volume = Volume::default();
        let (_, logs) = volume.open();
        LogFile::write(logs[0].as_ref(), 0, b"synced").unwrap();
        logs[0].sync_data().unwrap();
        LogFile::write(logs[0].as_ref(), 6, b"+lost").unwrap();
        let copy = volume.copy();
        volume.crash(
            Some(b"torn".to_vec()),
            &mut palisade_sim::SplitMix64::new(1),
        );
        let (_, logs) = volume.open();
        let mut out = [0; 10];
        LogFile::read(logs[0].as_ref(), 0, &mut out).unwrap();
        assert_eq!(&out, b"syncedtorn", "unsynced bytes lost, a torn tail left");
        assert_eq!(
            LogFile::len(logs[1].as_ref()).unwrap(),
            0,
            "an unused file stays empty"
        );
        let (_, copied) = copy.open();
        assert_eq!(
            LogFile::len(copied[0].as_ref()).unwrap(),
            6,
            "a copy holds what is synced"
        );
    }

    #[test]
    fn a_power_cut_in_a_write_keeps_a_subset_of_its_sectors_and_nothing_after_it() {
        use super::SECTOR_BYTES;
        use palisade_cluster::raft_log::LogFile;
        let mut seen_out_of_order = false;
        for seed in 0..40 {
            let volume = Volume::default();
            let (store, logs) = volume.open();
            LogFile::write(logs[0].as_ref(), 0, &[1; 100]).unwrap();
            logs[0].sync_data().unwrap();
            volume.arm_cut();
            assert!(!volume.cut_landed());
            // Six sectors' worth from byte 100: seven sectors touched.
            let write = vec![2u8; 6 * SECTOR_BYTES];
            LogFile::write(logs[0].as_ref(), 100, &write).unwrap();
            assert!(volume.cut_landed());
            assert!(logs[0].sync_data().is_err(), "the process is gone");
            assert!(
                redb::StorageBackend::sync_data(&store).is_err(),
                "on every disk of the volume"
            );
            let tear = volume
                .crash(None, &mut palisade_sim::SplitMix64::new(seed))
                .expect("it landed");
            assert_eq!(tear.sectors, 7);
            seen_out_of_order |= tear.out_of_order;
            let (_, logs) = volume.open();
            let length = LogFile::len(logs[0].as_ref()).unwrap() as usize;
            let mut bytes = vec![0; length];
            LogFile::read(logs[0].as_ref(), 0, &mut bytes).unwrap();
            assert_eq!(&bytes[..100], &[1; 100], "synced bytes stay");
            let kept = (0..7)
                .filter(|s| {
                    let from = (s * SECTOR_BYTES).max(100);
                    bytes.get(from) == Some(&2)
                })
                .count();
            assert_eq!(kept, tear.kept, "seed {seed}");
            assert!(bytes[100..].iter().all(|b| *b == 0 || *b == 2));
            // The next incarnation writes and syncs again.
            LogFile::write(logs[0].as_ref(), 0, &[3]).unwrap();
            logs[0].sync_data().unwrap();
        }
        assert!(
            seen_out_of_order,
            "some seed loses a sector before one it keeps"
        );
    }
}
