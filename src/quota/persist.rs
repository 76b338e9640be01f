//! Quota room, the local store's file: each meter's slices (spend and grants) in a `redb`
//! database, written whole in one transaction that is on disk when the commit returns. A crash
//! at any moment leaves the file as of the last commit, so a `kill -9` loses at most the spend
//! settled since the last flush (`quotas.flush_interval`).

use super::ledger::Slice;
use anyhow::Context;
use redb::{Database, DatabaseError, ReadableTable, TableDefinition};
use std::path::{Path, PathBuf};

/// `tenant \0 meter id` -> the meter's slices as JSON.
const SPEND: TableDefinition<&str, &[u8]> = TableDefinition::new("spend");

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

    /// Every meter's slices the file holds: `(tenant, meter id, slices)`.
    pub fn load(&self) -> anyhow::Result<Vec<(String, String, Vec<Slice>)>> {
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
            let slices: Vec<Slice> = serde_json::from_slice(value.value())
                .with_context(|| format!("quota file {}: meter {meter}", self.path.display()))?;
            out.push((tenant.to_string(), meter.to_string(), slices));
        }
        Ok(out)
    }

    /// Replaces what the file holds with `spend`, in one durable transaction.
    pub fn save(&mut self, spend: &[(String, String, Vec<Slice>)]) -> anyhow::Result<()> {
        let write = self.db.begin_write()?;
        {
            let mut table = write.open_table(SPEND)?;
            table.retain(|_, _| false)?;
            for (tenant, meter, slices) in spend {
                let key = format!("{tenant}\0{meter}");
                table.insert(key.as_str(), serde_json::to_vec(slices)?.as_slice())?;
            }
        }
        write
            .commit()
            .with_context(|| format!("writing the quota file {}", self.path.display()))?;
        Ok(())
    }
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
    use super::*;

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
