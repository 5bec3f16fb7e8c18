//! The coordinator's journal: jobs and each consumer's acknowledged
//! watermark, in a redb file under `--state-dir`, so that a restarted
//! coordinator resumes delivery where the trainers left off instead of
//! starting the epoch again.
//!
//! Only what cannot be rebuilt is kept. Workers and sessions re-register on
//! their own after a restart; batches above a watermark are simply produced
//! again, and a trainer drops any copy it already has.

use std::path::Path;

use loader_proto::pb;
#[cfg(feature = "journal")]
use prost::Message;
#[cfg(feature = "journal")]
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

/// job id -> encoded `pb::Job`.
#[cfg(feature = "journal")]
const JOBS: TableDefinition<u64, &[u8]> = TableDefinition::new("jobs");
/// (job id, consumer) -> acknowledged watermark.
#[cfg(feature = "journal")]
const WATERMARKS: TableDefinition<(u64, u32), u64> = TableDefinition::new("watermarks");
/// Counters: "boots", the number of times the coordinator started.
#[cfg(feature = "journal")]
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

/// Why the journal could not be read or written.
#[derive(Debug, thiserror::Error)]
#[error("journal {path}: {cause}")]
pub struct JournalError {
    /// The journal file.
    path: String,
    /// What went wrong, in one line.
    cause: String,
}

/// A job as journaled: the job and each consumer's watermark.
#[derive(Debug)]
pub(crate) struct JournaledJob {
    pub(crate) job: pb::Job,
    pub(crate) watermarks: Vec<(u32, u64)>,
}

/// The open journal.
#[cfg(feature = "journal")]
#[derive(Debug)]
pub(crate) struct Journal {
    db: Database,
    path: String,
}

#[cfg(feature = "journal")]
impl Journal {
    /// Opens (or creates) the journal in `dir`.
    pub(crate) fn open(dir: &Path) -> Result<Self, JournalError> {
        let file = dir.join("coordinator.redb");
        let path = file.display().to_string();
        let fail = |cause: String| JournalError { path: path.clone(), cause };
        std::fs::create_dir_all(dir).map_err(|e| fail(format!("cannot create the state directory: {e}")))?;
        let db = Database::create(&file).map_err(|e| fail(e.to_string()))?;
        let journal = Self { db, path };
        // Create the tables so that reads of a fresh journal find them.
        journal.write(|tx| {
            tx.open_table(JOBS)?;
            tx.open_table(WATERMARKS)?;
            tx.open_table(META)?;
            Ok(())
        })?;
        Ok(journal)
    }

    fn fail(&self, cause: impl ToString) -> JournalError {
        JournalError { path: self.path.clone(), cause: cause.to_string() }
    }

    fn write(&self, f: impl FnOnce(&redb::WriteTransaction) -> Result<(), redb::Error>) -> Result<(), JournalError> {
        let tx = self.db.begin_write().map_err(|e| self.fail(e))?;
        f(&tx).map_err(|e| self.fail(e))?;
        tx.commit().map_err(|e| self.fail(e))
    }

    /// Counts this start and returns its number (1 for the first).
    pub(crate) fn next_boot(&self) -> Result<u64, JournalError> {
        let mut boot = 0;
        self.write(|tx| {
            let mut meta = tx.open_table(META)?;
            boot = meta.get("boots")?.map_or(0, |v| v.value()) + 1;
            meta.insert("boots", boot)?;
            Ok(())
        })?;
        Ok(boot)
    }

    /// Records a new job.
    pub(crate) fn put_job(&self, job: &pb::Job) -> Result<(), JournalError> {
        let bytes = job.encode_to_vec();
        self.write(|tx| {
            tx.open_table(JOBS)?.insert(job.job_id, bytes.as_slice())?;
            Ok(())
        })
    }

    /// Records a consumer's acknowledged watermark.
    pub(crate) fn put_watermark(&self, job_id: u64, consumer: u32, consumed: u64) -> Result<(), JournalError> {
        self.write(|tx| {
            tx.open_table(WATERMARKS)?.insert((job_id, consumer), consumed)?;
            Ok(())
        })
    }

    /// Everything journaled, jobs in id order.
    pub(crate) fn load(&self) -> Result<Vec<JournaledJob>, JournalError> {
        let tx = self.db.begin_read().map_err(|e| self.fail(e))?;
        let jobs = tx.open_table(JOBS).map_err(|e| self.fail(e))?;
        let marks = tx.open_table(WATERMARKS).map_err(|e| self.fail(e))?;
        let mut out = Vec::new();
        for entry in jobs.iter().map_err(|e| self.fail(e))? {
            let (id, bytes) = entry.map_err(|e| self.fail(e))?;
            let job = pb::Job::decode(bytes.value()).map_err(|e| self.fail(format!("job {}: {e}", id.value())))?;
            let mut watermarks = Vec::new();
            let range = marks.range((id.value(), 0)..=(id.value(), u32::MAX)).map_err(|e| self.fail(e))?;
            for mark in range {
                let (key, consumed) = mark.map_err(|e| self.fail(e))?;
                watermarks.push((key.value().1, consumed.value()));
            }
            out.push(JournaledJob { job, watermarks });
        }
        Ok(out)
    }
}

/// No journal in this build (an embedded coordinator, built without the
/// `journal` feature): there is none to open, so `--state-dir` is refused
/// in one line, and no value of this type exists.
#[cfg(not(feature = "journal"))]
#[derive(Debug)]
pub(crate) enum Journal {}

#[cfg(not(feature = "journal"))]
impl Journal {
    /// Refuses: this build keeps no journal.
    pub(crate) fn open(dir: &Path) -> Result<Self, JournalError> {
        Err(JournalError {
            path: dir.display().to_string(),
            cause: "this build keeps no journal (built without the `journal` feature); the loader-server binary has it".into(),
        })
    }

    pub(crate) fn next_boot(&self) -> Result<u64, JournalError> {
        match *self {}
    }

    pub(crate) fn put_job(&self, _job: &pb::Job) -> Result<(), JournalError> {
        match *self {}
    }

    pub(crate) fn put_watermark(&self, _job_id: u64, _consumer: u32, _consumed: u64) -> Result<(), JournalError> {
        match *self {}
    }

    pub(crate) fn load(&self) -> Result<Vec<JournaledJob>, JournalError> {
        match *self {}
    }
}

#[cfg(all(test, feature = "journal"))]
mod tests {
    use super::*;

    #[test]
    fn survives_reopening() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let j = Journal::open(dir.path()).expect("open");
            assert_eq!(j.next_boot().expect("boot"), 1);
            j.put_job(&pb::Job { job_id: 3, num_samples: 10, batches_per_epoch: 2, spec: None }).expect("job");
            j.put_watermark(3, 1, 7).expect("mark");
            j.put_watermark(3, 1, 9).expect("mark");
            j.put_watermark(3, 0, 4).expect("mark");
        }
        let j = Journal::open(dir.path()).expect("reopen");
        assert_eq!(j.next_boot().expect("boot"), 2);
        let jobs = j.load().expect("load");
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs[0].job.job_id, 3);
        assert_eq!(jobs[0].watermarks, vec![(0, 4), (1, 9)]);
    }

    #[test]
    fn unusable_directory_is_a_one_line_error() {
        let file = tempfile::NamedTempFile::new().expect("file");
        let err = Journal::open(&file.path().join("sub")).expect_err("a file is not a directory");
        let msg = err.to_string();
        assert!(msg.starts_with("journal "), "{msg}");
        assert!(!msg.contains('\n'));
    }
}
