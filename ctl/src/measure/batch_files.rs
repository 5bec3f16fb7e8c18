//! The files a run writes batch by batch: `--checksum` and `--dump`.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use loader_client::Batch;

use crate::MeasureArgs;

/// `--checksum` and `--dump`, each written batch by batch when asked for.
pub(super) struct BatchFiles {
    checksum: Option<Dump>,
    dump: Option<Dump>,
}

impl BatchFiles {
    pub(super) fn create(args: &MeasureArgs) -> anyhow::Result<Self> {
        let dump = args.dump.as_deref().map(Dump::create).transpose()?;
        let checksum = args.checksum.as_deref().map(Dump::create).transpose()?;
        Ok(Self { checksum, dump })
    }

    pub(super) fn write(&mut self, batch: &Batch) -> anyhow::Result<()> {
        if let Some(checksum) = &mut self.checksum {
            checksum.checksum(batch)?;
        }
        if let Some(dump) = &mut self.dump {
            dump.line(batch)?;
        }
        Ok(())
    }
}

/// `--dump`: one line per batch, flushed as it is written so the file is
/// complete up to the last yielded batch even if the process is killed.
struct Dump {
    /// The file, with a buffer for assembling one line.
    out: BufWriter<File>,
    /// Where it is, for error messages.
    path: PathBuf,
}

impl Dump {
    fn create(path: &Path) -> anyhow::Result<Self> {
        let file = File::create(path)
            .with_context(|| format!("cannot create --dump file {}", path.display()))?;
        Ok(Self {
            out: BufWriter::new(file),
            path: path.to_owned(),
        })
    }

    /// `<seq> <fnv1a-64 of the batch's bytes, from the device if on one>`
    fn checksum(&mut self, batch: &Batch) -> anyhow::Result<()> {
        let sum = match batch.on_device() {
            Some(copy) => fnv1a(&copy.read_back()?),
            None => fnv1a(batch.bytes()),
        };
        writeln!(self.out, "{} {sum:016x}", batch.seq())
            .and_then(|()| self.out.flush())
            .with_context(|| format!("cannot write --checksum file {}", self.path.display()))
    }

    /// `<seq> <epoch> <idx0>,<idx1>,...`
    fn line(&mut self, batch: &Batch) -> anyhow::Result<()> {
        let mut write = || -> std::io::Result<()> {
            write!(self.out, "{} {} ", batch.seq(), batch.epoch())?;
            for (i, idx) in batch.indices().iter().enumerate() {
                if i > 0 {
                    self.out.write_all(b",")?;
                }
                write!(self.out, "{idx}")?;
            }
            self.out.write_all(b"\n")?;
            self.out.flush()
        };
        write().with_context(|| format!("cannot write --dump file {}", self.path.display()))
    }
}

/// FNV-1a, 64 bits: enough to tell two byte strings apart in a check.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}
