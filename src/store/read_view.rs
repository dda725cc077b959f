//! A read-only view of the database file, for the time writes fail.
//!
//! writer thread ──commit fails (EIO, ENOSPC, EFBIG)──▶ drop the failed Database
//!               ──▶ Database on [`ReadView`] (file opened O_RDONLY + writes kept in memory)
//! readers ──▶ the view: history stays readable while the disk is full
//!
//! After an I/O error a redb `Database` refuses every later operation
//! (`StorageError::PreviousIo`), reads included, until it is reopened, and
//! reopening it for writing needs writes (recovery, the "open" mark). This
//! backend lets redb open the file anyway: it reads the file and keeps every
//! write redb makes (the recovery of the crash-like state the failure left,
//! its bookkeeping) in memory, in 4 KiB blocks over the file's bytes. The
//! file itself is opened read-only, so nothing the view does can reach the
//! disk, and it takes no lock, so the writer can reopen the file for writing
//! beside it. Memory: only the blocks redb rewrote (headers, the allocator
//! state of its repair), not the database.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Mutex;

const BLOCK: u64 = 4096;

#[derive(Debug)]
pub struct ReadView {
    file: File,
    state: Mutex<Overlay>,
}

#[derive(Debug)]
struct Overlay {
    /// The length redb sees (it may grow or shrink the storage).
    len: u64,
    /// The file's length when the view opened: bytes past it read as zero.
    file_len: u64,
    /// Blocks redb wrote, by block number.
    blocks: HashMap<u64, Box<[u8]>>,
}

impl ReadView {
    pub fn open(path: &Path) -> io::Result<ReadView> {
        let file = File::open(path)?;
        let len = file.metadata()?.len();
        Ok(ReadView {
            file,
            state: Mutex::new(Overlay {
                len,
                file_len: len,
                blocks: HashMap::new(),
            }),
        })
    }
}

impl Overlay {
    /// Block `n` as redb last saw it: written, or from the file (zeros past its end).
    fn block(&self, file: &File, n: u64) -> io::Result<Box<[u8]>> {
        if let Some(b) = self.blocks.get(&n) {
            return Ok(b.clone());
        }
        let mut buf = vec![0u8; BLOCK as usize].into_boxed_slice();
        let start = n * BLOCK;
        if start < self.file_len {
            let end = (start + BLOCK).min(self.file_len);
            file.read_exact_at(&mut buf[..(end - start) as usize], start)?;
        }
        Ok(buf)
    }
}

impl redb::StorageBackend for ReadView {
    fn len(&self) -> Result<u64, io::Error> {
        Ok(self.state.lock().expect("read view lock").len)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        let state = self.state.lock().expect("read view lock");
        if offset + out.len() as u64 > state.len {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "read past the end of the storage",
            ));
        }
        let mut done = 0usize;
        while done < out.len() {
            let pos = offset + done as u64;
            let (n, within) = (pos / BLOCK, (pos % BLOCK) as usize);
            let take = (BLOCK as usize - within).min(out.len() - done);
            if !state.blocks.contains_key(&n) && pos + take as u64 <= state.file_len {
                self.file.read_exact_at(&mut out[done..done + take], pos)?;
            } else {
                let block = state.block(&self.file, n)?;
                out[done..done + take].copy_from_slice(&block[within..within + take]);
            }
            done += take;
        }
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        let mut state = self.state.lock().expect("read view lock");
        if len < state.len {
            // Bytes cut off and grown back must read as zero.
            let first_gone = len / BLOCK;
            state.blocks.retain(|&n, _| n < first_gone);
            if !len.is_multiple_of(BLOCK) {
                let n = len / BLOCK;
                let mut block = state.block(&self.file, n)?;
                block[(len % BLOCK) as usize..].fill(0);
                state.blocks.insert(n, block);
            }
            state.file_len = state.file_len.min(len);
        }
        state.len = len;
        Ok(())
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        let mut state = self.state.lock().expect("read view lock");
        let mut done = 0usize;
        while done < data.len() {
            let pos = offset + done as u64;
            let (n, within) = (pos / BLOCK, (pos % BLOCK) as usize);
            let take = (BLOCK as usize - within).min(data.len() - done);
            let mut block = state.block(&self.file, n)?;
            block[within..within + take].copy_from_slice(&data[done..done + take]);
            state.blocks.insert(n, block);
            done += take;
        }
        state.len = state.len.max(offset + data.len() as u64);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redb::{Database, ReadableDatabase, TableDefinition};

    const T: TableDefinition<u64, &str> = TableDefinition::new("t");

    #[test]
    fn a_view_reads_what_was_committed_and_never_changes_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.redb");
        let db = Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(T).unwrap().insert(1, "one").unwrap();
        txn.commit().unwrap();
        // Still open for writing, as after a failed commit: the view must
        // recover the state in memory.
        let before = std::fs::read(&path).unwrap();
        let view = Database::builder()
            .create_with_backend(ReadView::open(&path).unwrap())
            .unwrap();
        let read = view.begin_read().unwrap();
        assert_eq!(
            read.open_table(T).unwrap().get(1).unwrap().unwrap().value(),
            "one"
        );
        drop(read);
        let txn = view.begin_write().unwrap();
        txn.open_table(T).unwrap().insert(2, "two").unwrap();
        txn.commit().unwrap();
        drop(view);
        assert_eq!(std::fs::read(&path).unwrap(), before);
        drop(db);
    }
}
