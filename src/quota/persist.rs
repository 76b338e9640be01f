//! Quota room, the local store's file: each meter's slices (spend and grants) in a `redb`
//! database, written whole in one transaction that is on disk when the commit returns. A crash
//! at any moment leaves the file as of the last commit, so a `kill -9` loses at most the spend
//! settled since the last flush (`quotas.flush_interval`).
//!
//! A file damaged otherwise (bytes overwritten, cut short: redb refuses it, or panics opening
//! it) does not stop the gateway: [`QuotaFile::recover`] sets it aside and keeps every meter
//! whose record can still be read in its bytes. Each record names its tenant, its meter and the
//! write it belongs to, so a scan of the bytes finds them without redb, and takes each meter's
//! latest.

use super::ledger::Slice;
use anyhow::Context;
use redb::{Database, DatabaseError, ReadableTable, StorageError, TableDefinition};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// `tenant \0 meter id` -> the meter's [`Record`] as JSON.
const SPEND: TableDefinition<&str, &[u8]> = TableDefinition::new("spend");

/// `generation` -> how many writes the file has had.
const WRITES: TableDefinition<&str, u64> = TableDefinition::new("writes");

/// What every record begins with: the mark a scan of a damaged file looks for.
const RECORD_MARK: &[u8] = br#"{"quota_record":"#;

/// One meter as the file keeps it: the record's format (1), the write it belongs to, and the
/// meter named whole. Generic so that it is written from borrowed parts and read into owned.
#[derive(Debug, Serialize, Deserialize)]
struct Record<S, V> {
    quota_record: u32,
    generation: u64,
    tenant: S,
    meter: S,
    slices: V,
}

/// A meter's value as the file may hold it: a record, or the bare slices of a file written
/// before records named their meters.
#[derive(Deserialize)]
#[serde(untagged)]
enum Stored {
    Record(Record<String, Vec<Slice>>),
    Slices(Vec<Slice>),
}

/// Every meter's slices: `(tenant, meter id, slices)`.
pub type Spend = Vec<(String, String, Vec<Slice>)>;

/// What a quota file's database is opened on: the file system, or in tests a disk that fails
/// when told (a full disk is made without filling one).
pub trait Disk: Send + Sync + std::fmt::Debug + 'static {
    /// The database in the file at `path`, made when missing (locked: another process holding
    /// it open is [`DatabaseError::DatabaseAlreadyOpen`]).
    fn open(&self, path: &Path) -> Result<Database, DatabaseError>;
}

/// The file system.
#[derive(Debug, Clone, Copy, Default)]
pub struct FileSystem;

impl Disk for FileSystem {
    fn open(&self, path: &Path) -> Result<Database, DatabaseError> {
        Database::create(path)
    }
}

/// The file a [`super::store::LocalQuotaStore`] keeps its spend in.
pub struct QuotaFile {
    db: Database,
    path: PathBuf,
}

impl std::fmt::Debug for QuotaFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuotaFile")
            .field("path", &self.path)
            .finish()
    }
}

impl QuotaFile {
    /// Opens the file at `path`, made when missing (another process holding it open is an
    /// error: two gateways cannot share one file).
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        Self::open_on(path, &FileSystem)
    }

    /// [`QuotaFile::open`] on `disk`.
    pub fn open_on(path: &Path, disk: &dyn Disk) -> anyhow::Result<Self> {
        let db = disk.open(path).with_context(|| {
            format!(
                "opening the quota file {} (quotas.path; one gateway per file)",
                path.display()
            )
        })?;
        Ok(Self {
            db,
            path: path.to_path_buf(),
        })
    }

    /// Opens the file at `path` on `disk` and reads every meter it holds. A file that is
    /// damaged (redb finds it corrupted or panics reading it, or a record is not JSON; any
    /// other error, as another gateway holding it, no permission or a failing disk, is an error
    /// as [`QuotaFile::open`]'s) is replaced: the meters whose records can still be read in its
    /// bytes (each at its latest write) are written to `<name>.recovering`, the damaged file is
    /// set aside as `<name>.damaged` (`.damaged.1`, ... when that is taken) and the new one
    /// takes its name, and the damage, what was kept, and that every other meter's spend is
    /// lost are logged. Stopped anywhere in between, the next start finds either the damaged
    /// file at `path` (and recovers again) or the recovered one at `<name>.recovering` (and
    /// takes it): never no file.
    pub fn recover(path: &Path, disk: &dyn Disk) -> anyhow::Result<(Self, Spend)> {
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let recovering = path.with_file_name(format!("{name}.recovering"));
        if !path.exists() && recovering.exists() {
            std::fs::rename(&recovering, path).with_context(|| {
                format!(
                    "taking the recovered quota file {} as {}",
                    recovering.display(),
                    path.display()
                )
            })?;
        }
        let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let file = Self::open_on(path, disk)?;
            let spend = file.load()?;
            Ok::<_, anyhow::Error>((file, spend))
        }));
        let cause = match opened {
            Ok(Ok(opened)) => return Ok(opened),
            Ok(Err(e)) if !is_damage(&e) => return Err(e),
            Ok(Err(e)) => format!("{e:#}"),
            Err(panic) => {
                let said = (panic.downcast_ref::<&str>().copied())
                    .or_else(|| panic.downcast_ref::<String>().map(String::as_str));
                format!(
                    "redb panicked reading it: {}",
                    said.unwrap_or("(no message)")
                )
            }
        };
        let bytes = std::fs::read(path)
            .with_context(|| format!("reading the damaged quota file {}", path.display()))?;
        let spend = scan(&bytes);
        if recovering.exists() {
            std::fs::remove_file(&recovering)
                .with_context(|| format!("removing the unfinished {}", recovering.display()))?;
        }
        Self::open_on(&recovering, disk)?.save(&spend)?;
        let aside = (0..)
            .map(|n| match n {
                0 => path.with_file_name(format!("{name}.damaged")),
                n => path.with_file_name(format!("{name}.damaged.{n}")),
            })
            .find(|aside| !aside.exists())
            .expect("a free name");
        for (from, to) in [(path, aside.as_path()), (recovering.as_path(), path)] {
            std::fs::rename(from, to).with_context(|| {
                format!(
                    "renaming the quota file {} to {}",
                    from.display(),
                    to.display()
                )
            })?;
        }
        let file = Self::open_on(path, disk)?;
        let meters: Vec<String> = (spend.iter())
            .map(|(tenant, meter, _)| format!("{tenant} {meter}"))
            .collect();
        tracing::error!(
            path = %path.display(),
            set_aside = %aside.display(),
            cause,
            kept = spend.len(),
            meters = ?meters.join(", "),
            "the quota file was damaged: it is set aside and the meters it still held are kept in a new one; every other meter's spend and grants are lost (they start from nothing)"
        );
        Ok((file, spend))
    }

    /// Every meter's slices the file holds: `(tenant, meter id, slices)`.
    pub fn load(&self) -> anyhow::Result<Spend> {
        let read = self.db.begin_read()?;
        let table = match read.open_table(SPEND) {
            Ok(table) => table,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        let mut out = Vec::new();
        for entry in table.iter()? {
            let (key, value) = entry?;
            let Some((tenant, meter)) = key.value().split_once('\0') else {
                continue;
            };
            let stored: Stored = serde_json::from_slice(value.value())
                .with_context(|| format!("quota file {}: meter {meter}", self.path.display()))?;
            let slices = match stored {
                Stored::Record(record) => record.slices,
                Stored::Slices(slices) => slices,
            };
            out.push((tenant.to_string(), meter.to_string(), slices));
        }
        Ok(out)
    }

    /// Replaces what the file holds with `spend`, in one durable transaction.
    pub fn save(&mut self, spend: &[(String, String, Vec<Slice>)]) -> anyhow::Result<()> {
        let write = self.db.begin_write()?;
        {
            let mut writes = write.open_table(WRITES)?;
            let generation = writes.get("generation")?.map_or(0, |g| g.value()) + 1;
            writes.insert("generation", generation)?;
            let mut table = write.open_table(SPEND)?;
            table.retain(|_, _| false)?;
            for (tenant, meter, slices) in spend {
                let key = format!("{tenant}\0{meter}");
                let record = Record {
                    quota_record: 1,
                    generation,
                    tenant: tenant.as_str(),
                    meter: meter.as_str(),
                    slices: slices.as_slice(),
                };
                table.insert(key.as_str(), serde_json::to_vec(&record)?.as_slice())?;
            }
        }
        write
            .commit()
            .with_context(|| format!("writing the quota file {}", self.path.display()))?;
        Ok(())
    }
}

/// Whether `e`, opening or reading a quota file, proves the file damaged: redb found it
/// corrupted, or a record is not JSON. Anything else (held by another process, not readable,
/// of an older format, a failing or full disk) is a file the gateway may not use now, not one
/// to replace.
fn is_damage(e: &anyhow::Error) -> bool {
    let corrupted = |s: &StorageError| matches!(s, StorageError::Corrupted(_));
    e.chain().any(|c| {
        c.is::<serde_json::Error>()
            || c.downcast_ref::<StorageError>().is_some_and(corrupted)
            || matches!(c.downcast_ref::<DatabaseError>(), Some(DatabaseError::Storage(s)) if corrupted(s))
            || matches!(c.downcast_ref::<redb::TransactionError>(), Some(redb::TransactionError::Storage(s)) if corrupted(s))
            || matches!(c.downcast_ref::<redb::TableError>(), Some(redb::TableError::Storage(s)) if corrupted(s))
    })
}

/// Every meter whose record can be read in `bytes`, at the latest write found of it. Records
/// left by earlier writes in pages redb has not reused are older: each meter's newest wins.
fn scan(bytes: &[u8]) -> Spend {
    let mut newest: BTreeMap<(String, String), (u64, Vec<Slice>)> = BTreeMap::new();
    for at in memchr::memmem::find_iter(bytes, RECORD_MARK) {
        let mut records = serde_json::Deserializer::from_slice(&bytes[at..])
            .into_iter::<Record<String, Vec<Slice>>>();
        let Some(Ok(r)) = records.next() else {
            continue;
        };
        let found = newest.entry((r.tenant, r.meter)).or_insert((0, Vec::new()));
        if r.generation >= found.0 {
            *found = (r.generation, r.slices);
        }
    }
    (newest.into_iter())
        .map(|((tenant, meter), (_, slices))| (tenant, meter, slices))
        .collect()
}

/// A disk that fills up when told, for tests: while full, every write, sync and resize of its
/// files fails as a full file system's does.
#[cfg(test)]
pub(crate) mod testing {
    use super::Disk;
    use redb::backends::FileBackend;
    use redb::{Database, DatabaseError, StorageBackend};
    use std::io;
    use std::path::Path;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    /// A fresh folder for a test's quota file, removed when dropped.
    pub(crate) struct Folder(pub(crate) std::path::PathBuf);

    impl Folder {
        pub(crate) fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("tokengate-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }
    }

    impl Drop for Folder {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// The file system, full while [`FullDisk::fill`] says so.
    #[derive(Debug, Clone, Default)]
    pub(crate) struct FullDisk(Arc<AtomicBool>);

    impl FullDisk {
        pub(crate) fn fill(&self, full: bool) {
            self.0.store(full, Ordering::SeqCst);
        }
    }

    impl Disk for FullDisk {
        fn open(&self, path: &Path) -> Result<Database, DatabaseError> {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)?;
            redb::Builder::new().create_with_backend(Filling {
                file: FileBackend::new(file)?,
                full: self.0.clone(),
            })
        }
    }

    #[derive(Debug)]
    struct Filling {
        file: FileBackend,
        full: Arc<AtomicBool>,
    }

    impl Filling {
        fn room(&self) -> io::Result<()> {
            match self.full.load(Ordering::SeqCst) {
                true => Err(io::Error::new(
                    io::ErrorKind::StorageFull,
                    "No space left on device",
                )),
                false => Ok(()),
            }
        }
    }

    impl StorageBackend for Filling {
        fn len(&self) -> io::Result<u64> {
            self.file.len()
        }

        fn read(&self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
            self.file.read(offset, len)
        }

        fn set_len(&self, len: u64) -> io::Result<()> {
            self.room()?;
            self.file.set_len(len)
        }

        fn sync_data(&self, eventual: bool) -> io::Result<()> {
            self.room()?;
            self.file.sync_data(eventual)
        }

        fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
            self.room()?;
            self.file.write(offset, data)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::Folder;
    use super::*;
    use crate::quota::store::{LocalQuotaStore, WriteErrors};

    /// 50 tenants' meters, tenant `tI` with `10 x I` spent.
    fn fifty() -> Vec<(String, String, Vec<Slice>)> {
        (0..50u64)
            .map(|i| {
                let slice = Slice {
                    start: i as i64,
                    spent: 10 * i,
                    granted: 0,
                };
                (format!("t{i}"), "1d|total".to_string(), vec![slice])
            })
            .collect()
    }

    /// The fifty meters written to a file at `path`, which `damage` then changes; the gateway's
    /// store opened on it; what the file holds after.
    fn recovered(
        path: &Path,
        damage: impl FnOnce(&mut Vec<u8>),
    ) -> Vec<(String, String, Vec<Slice>)> {
        // An earlier write of a token less each, whose records redb may leave in pages it has
        // not reused: the later write's win.
        let mut file = QuotaFile::open(path).unwrap();
        let mut earlier = fifty();
        for (_, _, slices) in &mut earlier {
            slices[0].spent = slices[0].spent.saturating_sub(1);
        }
        file.save(&earlier).unwrap();
        file.save(&fifty()).unwrap();
        drop(file);
        let mut bytes = std::fs::read(path).unwrap();
        damage(&mut bytes);
        std::fs::write(path, &bytes).unwrap();
        drop(LocalQuotaStore::persisted(path, WriteErrors::default()).unwrap());
        let aside = std::fs::read(path.with_file_name("quotas.redb.damaged")).unwrap();
        assert_eq!(aside, bytes, "the damaged file is kept aside as it was");
        let mut kept = QuotaFile::open(path).unwrap().load().unwrap();
        kept.sort_by_key(|(tenant, _, _)| tenant[1..].parse::<u64>().unwrap());
        kept
    }

    /// A file another gateway holds is not damaged: opening it is refused as before, and it
    /// stays where it is.
    #[test]
    fn a_file_held_by_another_gateway_is_refused_not_set_aside() {
        let folder = Folder::new("quota-held");
        let path = folder.0.join("quotas.redb");
        let _held = QuotaFile::open(&path).unwrap();
        let e = QuotaFile::recover(&path, &FileSystem).unwrap_err();
        assert!(format!("{e:#}").contains("Database already open"), "{e:#}");
        assert!(path.exists() && !path.with_file_name("quotas.redb.damaged").exists());
    }

    /// A file written before records named their meters (bare slices) is read as it was.
    #[test]
    fn a_file_of_bare_slices_is_read() {
        let folder = Folder::new("quota-bare");
        let path = folder.0.join("quotas.redb");
        let file = QuotaFile::open(&path).unwrap();
        let write = file.db.begin_write().unwrap();
        {
            let mut table = write.open_table(SPEND).unwrap();
            let bare = br#"[{"start":10,"spent":5,"granted":2}]"#;
            table
                .insert("a\0calendar-day|decode", bare.as_slice())
                .unwrap();
        }
        write.commit().unwrap();
        let slice = Slice {
            start: 10,
            spent: 5,
            granted: 2,
        };
        assert_eq!(
            file.load().unwrap(),
            vec![("a".into(), "calendar-day|decode".into(), vec![slice])]
        );
    }

    /// A file cut in half (redb panics opening it) is set aside and every meter it still holds
    /// is kept; before, the gateway could not start.
    #[test]
    fn a_truncated_file_is_set_aside_and_what_it_holds_is_kept() {
        let folder = Folder::new("quota-truncated");
        let path = folder.0.join("quotas.redb");
        let kept = recovered(&path, |bytes| bytes.truncate(bytes.len() / 2));
        assert_eq!(kept, fifty());
    }

    /// Bytes of tenant t7's meter overwritten: the other 49 are kept, t7's is lost.
    #[test]
    fn a_file_with_damaged_bytes_keeps_every_meter_but_the_damaged_one() {
        let folder = Folder::new("quota-corrupted");
        let path = folder.0.join("quotas.redb");
        let kept = recovered(&path, |bytes| {
            let t7 = br#"{"start":7,"spent":70"#;
            let at = (bytes.windows(t7.len()))
                .position(|w| w == t7)
                .expect("t7's slices are in the file");
            bytes[at..at + t7.len()].fill(b'#');
        });
        let mut others = fifty();
        others.remove(7);
        assert_eq!(kept, others);
    }

    /// A recovery stopped after the recovered file was written and the damaged one set aside
    /// (no file at `path`): the next start takes the recovered one, never none. A second damage
    /// is set aside beside the first, which is kept.
    #[test]
    fn a_recovery_stopped_half_way_is_finished_by_the_next_and_the_first_damage_is_kept() {
        let folder = Folder::new("quota-half-way");
        let path = folder.0.join("quotas.redb");
        let recovering = folder.0.join("quotas.redb.recovering");
        QuotaFile::open(&recovering)
            .unwrap()
            .save(&fifty())
            .unwrap();
        let (_, spend) = QuotaFile::recover(&path, &FileSystem).unwrap();
        assert_eq!((spend.len(), recovering.exists()), (50, false));

        std::fs::write(folder.0.join("quotas.redb.damaged"), b"the first").unwrap();
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
        drop(LocalQuotaStore::persisted(&path, WriteErrors::default()).unwrap());
        let first = std::fs::read(folder.0.join("quotas.redb.damaged")).unwrap();
        let second = std::fs::read(folder.0.join("quotas.redb.damaged.1")).unwrap();
        assert_eq!(
            (first.as_slice(), second.len()),
            (&b"the first"[..], bytes.len() / 2)
        );
        assert_eq!(QuotaFile::open(&path).unwrap().load().unwrap().len(), 50);
    }

    /// `scan` keeps each meter's record of the latest write whatever order the records lie in,
    /// and passes over a record cut short and bytes between records.
    #[test]
    fn a_scan_keeps_each_meters_newest_record() {
        let record = |generation: u64, spent: u64| {
            let slices = [Slice {
                start: 1,
                spent,
                granted: 0,
            }];
            serde_json::to_vec(&Record {
                quota_record: 1,
                generation,
                tenant: "a",
                meter: "1d|total",
                slices: slices.as_slice(),
            })
            .unwrap()
        };
        let spent = |bytes: &[u8]| {
            let spend = scan(bytes);
            assert_eq!(spend.len(), 1);
            spend[0].2[0].spent
        };
        let (older, newer) = (record(1, 10), record(2, 20));
        let cut = &newer[..newer.len() - 3];
        assert_eq!(spent(&[older.as_slice(), b"junk", &newer].concat()), 20);
        assert_eq!(spent(&[newer.as_slice(), b"\0\0", &older].concat()), 20);
        assert_eq!(spent(&[older.as_slice(), cut].concat()), 10);
    }

    #[test]
    fn what_is_saved_is_loaded_by_the_next_open_and_a_save_replaces_it() {
        let dir = std::env::temp_dir().join(format!("tokengate-quota-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("quotas.redb");
        let _ = std::fs::remove_file(&path);
        let slice = |start, spent| Slice {
            start,
            spent,
            granted: 0,
        };
        {
            let mut file = QuotaFile::open(&path).unwrap();
            assert_eq!(file.load().unwrap(), vec![]);
            file.save(&[
                ("a".into(), "calendar-day|decode".into(), vec![slice(10, 5)]),
                (
                    "b".into(),
                    "1h|total".into(),
                    vec![slice(1, 2), slice(2, 3)],
                ),
            ])
            .unwrap();
        }
        let mut file = QuotaFile::open(&path).unwrap();
        assert_eq!(
            file.load().unwrap(),
            vec![
                ("a".into(), "calendar-day|decode".into(), vec![slice(10, 5)]),
                (
                    "b".into(),
                    "1h|total".into(),
                    vec![slice(1, 2), slice(2, 3)]
                ),
            ]
        );
        file.save(&[("a".into(), "calendar-day|decode".into(), vec![slice(10, 7)])])
            .unwrap();
        assert_eq!(
            file.load().unwrap(),
            vec![("a".into(), "calendar-day|decode".into(), vec![slice(10, 7)])]
        );
        drop(file);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
