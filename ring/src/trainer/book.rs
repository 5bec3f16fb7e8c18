//! The book of the ring's slots: who holds each one, and the grants that are
//! the credits of the ring's connections.
//!
//! A slot is `Free`, `Granted` to one connection with a generation, or
//! `Held` for the user (filled, viewed by a batch). A connection's credits
//! are like a gRPC stream's: its grants plus its batches that wait in the
//! consumer (filled, not yet yielded) stay below `prefetch`, so a fast worker
//! cannot fill the whole ring with batches that wait behind a slow one's.
//! Free slots go to the connection using the fewest credits, round-robin
//! among equals, and no connection holds more than its fair share of unused
//! grants (slots / connections), so an idle worker cannot starve a busy one;
//! when a worker attaches after the others hold every slot, those above
//! their fair share are asked to return the excess (`SlotReclaim`). A report from a worker is checked here
//! before it can become a view: a slot outside the ring, one not granted to
//! that connection, a stale generation or a length past the slot is refused.
//! A held slot is represented by exactly one [`SlotRelease`]; dropping it
//! frees the slot and grants it again with a new generation.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use loader_proto::pb::SlotGrant;
use crate::frame::RingGeometry;

use super::conn_id::ConnId;
use super::grant::GrantLine;

/// A report the book refuses: the worker broke the protocol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SlotError {
    /// No such slot.
    #[error("reported slot {slot} of a ring of {count} slots")]
    OutOfRange {
        /// Slot named.
        slot: u32,
        /// Slots in the ring.
        count: u32,
    },
    /// The slot is not granted to this connection.
    #[error("reported slot {slot}, which is not granted to it")]
    NotGranted {
        /// Slot named.
        slot: u32,
    },
    /// The generation is not that of the slot's grant.
    #[error(
        "reported slot {slot} with generation {generation}, but it was granted with generation {granted}"
    )]
    WrongGeneration {
        /// Slot named.
        slot: u32,
        /// Generation reported.
        generation: u64,
        /// Generation of the grant.
        granted: u64,
    },
    /// More bytes than a slot holds.
    #[error("reported {len} bytes in slot {slot}, but slots hold {slot_size} bytes")]
    TooLong {
        /// Slot named.
        slot: u32,
        /// Bytes reported.
        len: u64,
        /// Bytes per slot.
        slot_size: u64,
    },
}

/// Who holds a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// On the free list.
    Free,
    /// Granted to a connection: its worker may be writing it.
    Granted {
        /// The connection.
        conn: ConnId,
        /// Generation of the grant.
        generation: u64,
    },
    /// Filled and viewed by the user; its [`SlotRelease`] frees it.
    Held {
        /// Generation of the grant it was filled under.
        generation: u64,
    },
}

/// A connection's account.
#[derive(Debug)]
struct Account {
    /// Slots granted to it and not yet reported.
    grants: u32,
    /// Its batches the consumer holds but has not yielded yet.
    waiting: u32,
    /// Grants asked back (`SlotReclaim`) and not returned yet.
    reclaiming: u32,
    /// Writes grants to the worker's socket.
    line: GrantLine,
}

#[derive(Debug)]
struct State {
    geometry: RingGeometry,
    /// Most grants one connection holds at a time.
    prefetch: u32,
    /// Holder of each slot, indexed by slot.
    slots: Vec<Slot>,
    /// Generation of each slot's latest grant (0: never granted).
    generations: Vec<u64>,
    /// Free slots, a stack: the slot freed last is granted first. Its pages
    /// are already mapped in the trainer and the workers and warm in cache,
    /// so a ring larger than the work in flight keeps using the same few
    /// slots; taking the oldest instead would cycle through every slot and
    /// pay a page fault per 4 KiB of each, in every process, on first use.
    free: Vec<u32>,
    /// Open connections.
    accounts: BTreeMap<ConnId, Account>,
    /// The connection granted last, for round-robin among equals.
    cursor: ConnId,
    /// Last connection id handed out.
    next_conn: ConnId,
}

/// Counts of slots by state, for tests and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Census {
    /// Slots on the free list.
    pub free: usize,
    /// Slots granted to workers.
    pub granted: usize,
    /// Slots held by the user's batches.
    pub held: usize,
}

/// The shared book; every change happens under its lock.
#[derive(Debug)]
pub(crate) struct Book {
    state: Mutex<State>,
}

impl Book {
    /// Every slot free; no connection.
    pub(crate) fn new(geometry: RingGeometry, prefetch: u32) -> Arc<Self> {
        let count = geometry.slot_count as usize;
        Arc::new(Self {
            state: Mutex::new(State {
                geometry,
                prefetch: prefetch.max(1),
                slots: vec![Slot::Free; count],
                generations: vec![0; count],
                // Slot 0 on top: granted first.
                free: (0..geometry.slot_count).rev().collect(),
                accounts: BTreeMap::new(),
                cursor: 0,
                next_conn: 0,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Plain book-keeping that stays consistent across a panic elsewhere.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Opens an account for a new connection, whose grants go to the line
    /// `line` makes for its id, and grants it what is free.
    pub(crate) fn open(&self, line: impl FnOnce(ConnId) -> GrantLine) -> ConnId {
        let mut st = self.lock();
        st.next_conn += 1;
        let id = st.next_conn;
        st.accounts.insert(
            id,
            Account {
                grants: 0,
                waiting: 0,
                reclaiming: 0,
                line: line(id),
            },
        );
        st.distribute();
        id
    }

    /// Sends the grants a connection's socket could not take before (it is
    /// writable again).
    pub(crate) fn flush(&self, conn: ConnId) {
        if let Some(a) = self.lock().accounts.get_mut(&conn) {
            a.line.flush();
        }
    }

    /// Closes a connection's account: its granted slots are free again (its
    /// worker is gone and writes no more); held slots stay with the views.
    /// Returns how many grants it still held.
    pub(crate) fn close(&self, conn: ConnId) -> u32 {
        let mut st = self.lock();
        let n = st.reclaim(conn);
        st.distribute();
        n
    }

    /// A worker reports a batch of `len` bytes in `slot`: the slot becomes
    /// the user's, represented by the returned release.
    pub(crate) fn filled(
        self: &Arc<Self>,
        conn: ConnId,
        slot: u32,
        generation: u64,
        len: u64,
    ) -> Result<SlotRelease, SlotError> {
        let mut st = self.lock();
        st.check_granted(conn, slot, generation)?;
        let slot_size = st.geometry.slot_size;
        if len > slot_size {
            return Err(SlotError::TooLong {
                slot,
                len,
                slot_size,
            });
        }
        st.slots[slot as usize] = Slot::Held { generation };
        st.spent(conn);
        if let Some(a) = st.accounts.get_mut(&conn) {
            a.waiting += 1;
        }
        st.distribute();
        Ok(SlotRelease {
            book: Arc::clone(self),
            slot,
            generation,
        })
    }

    /// The consumer yielded (or dropped as a copy) a batch `conn` filled:
    /// that credit is the connection's again.
    pub(crate) fn yielded(&self, conn: ConnId) {
        let mut st = self.lock();
        if let Some(a) = st.accounts.get_mut(&conn) {
            a.waiting = a.waiting.saturating_sub(1);
            st.distribute();
        }
    }

    /// A worker gives back a grant it did not use.
    pub(crate) fn returned(
        &self,
        conn: ConnId,
        slot: u32,
        generation: u64,
    ) -> Result<(), SlotError> {
        let mut st = self.lock();
        st.check_granted(conn, slot, generation)?;
        st.slots[slot as usize] = Slot::Free;
        st.free.push(slot);
        st.spent(conn);
        if let Some(a) = st.accounts.get_mut(&conn) {
            a.reclaiming = a.reclaiming.saturating_sub(1);
        }
        st.distribute();
        Ok(())
    }

    /// The last view of a held slot is gone.
    fn release(&self, slot: u32, generation: u64) {
        let mut st = self.lock();
        if st.slots.get(slot as usize) == Some(&Slot::Held { generation }) {
            st.slots[slot as usize] = Slot::Free;
            st.free.push(slot);
            st.distribute();
        }
    }

    /// Grants the workers have been sent and not yet reported on: the
    /// filled reports that can come before the consumer frees a slot.
    pub(crate) fn known_grants(&self) -> u32 {
        let st = self.lock();
        st.accounts
            .values()
            .map(|a| a.grants.saturating_sub(a.line.queued()))
            .sum()
    }

    /// Connections with credits to spare but no grant while no slot is
    /// free: every slot is held by batches or granted elsewhere, so these
    /// workers cannot deliver until a batch is dropped.
    pub(crate) fn starved(&self) -> usize {
        let st = self.lock();
        if !st.free.is_empty() {
            return 0;
        }
        st.accounts
            .values()
            .filter(|a| a.grants == 0 && a.credits() < st.prefetch)
            .count()
    }

    /// Slots by state.
    pub(crate) fn census(&self) -> Census {
        let st = self.lock();
        let mut c = Census::default();
        for s in &st.slots {
            match s {
                Slot::Free => c.free += 1,
                Slot::Granted { .. } => c.granted += 1,
                Slot::Held { .. } => c.held += 1,
            }
        }
        c
    }
}

impl Account {
    /// Credits in use: grants, and batches waiting to be yielded.
    fn credits(&self) -> u32 {
        self.grants.saturating_add(self.waiting)
    }
}

impl State {
    fn check_granted(&self, conn: ConnId, slot: u32, generation: u64) -> Result<(), SlotError> {
        let count = self.geometry.slot_count;
        let Some(state) = self.slots.get(slot as usize).filter(|_| slot < count) else {
            return Err(SlotError::OutOfRange { slot, count });
        };
        match *state {
            Slot::Granted {
                conn: c,
                generation: g,
            } if c == conn => {
                if g == generation {
                    Ok(())
                } else {
                    Err(SlotError::WrongGeneration {
                        slot,
                        generation,
                        granted: g,
                    })
                }
            }
            _ => Err(SlotError::NotGranted { slot }),
        }
    }

    fn spent(&mut self, conn: ConnId) {
        if let Some(a) = self.accounts.get_mut(&conn) {
            a.grants = a.grants.saturating_sub(1);
        }
    }

    fn reclaim(&mut self, conn: ConnId) -> u32 {
        let Some(account) = self.accounts.remove(&conn) else {
            return 0;
        };
        for (i, s) in self.slots.iter_mut().enumerate() {
            if matches!(*s, Slot::Granted { conn: c, .. } if c == conn) {
                *s = Slot::Free;
                self.free.push(i as u32);
            }
        }
        account.grants
    }

    /// The connection to grant next: the fewest credits in use below
    /// `prefetch`, the first after the cursor among equals.
    fn pick(&self) -> Option<ConnId> {
        let after = self.accounts.range(self.cursor + 1..);
        let before = self.accounts.range(..=self.cursor);
        // A connection holds at most its fair share of unused grants: a
        // worker gone idle cannot keep slots the busy ones need (it is never
        // asked to give them back), whatever the number of workers.
        let fair = self.fair_share();
        let mut best: Option<(ConnId, u32)> = None;
        for (&id, a) in after.chain(before) {
            let used = a.credits();
            if used < self.prefetch
                && a.grants < fair
                && !a.line.is_broken()
                && best.is_none_or(|(_, b)| used < b)
            {
                best = Some((id, used));
            }
        }
        best.map(|(id, _)| id)
    }

    /// Most unused grants one connection may hold: the ring split evenly.
    fn fair_share(&self) -> u32 {
        (self.slots.len() / self.accounts.len().max(1)).max(1) as u32
    }

    /// Grants free slots while a connection has room, then sends each
    /// connection's new grants in one write, unless it can wait (see
    /// [`State::hold_back`]).
    fn distribute(&mut self) {
        while !self.free.is_empty() {
            let Some(conn) = self.pick() else { break };
            let Some(account) = self.accounts.get_mut(&conn) else {
                break;
            };
            let Some(slot) = self.free.pop() else {
                break;
            };
            let i = slot as usize;
            self.generations[i] += 1;
            let generation = self.generations[i];
            account.line.push(SlotGrant { slot, generation });
            account.grants += 1;
            self.slots[i] = Slot::Granted { conn, generation };
            self.cursor = conn;
        }
        let reclaimed = self.reclaim_for_starved();
        let low_water = self.low_water();
        for (id, account) in &mut self.accounts {
            if reclaimed.contains(id) || !hold_back(account, low_water) {
                account.line.flush();
            }
        }
    }

    /// Every slot is granted or held, and a connection that could use a
    /// grant holds none (its worker attached after the others took every
    /// slot): each connection holding more unused grants than its fair
    /// share is asked to give the excess back. Grants are otherwise never
    /// taken back, so workers gone idle would keep them for ever and the
    /// late worker could never write a batch — perhaps the very one the
    /// in-order consumer waits for. Returns the connections asked.
    fn reclaim_for_starved(&mut self) -> Vec<ConnId> {
        let prefetch = self.prefetch;
        let starved = self.free.is_empty()
            && self
                .accounts
                .values()
                .any(|a| a.grants == 0 && a.credits() < prefetch && !a.line.is_broken());
        if !starved {
            return Vec::new();
        }
        let fair = self.fair_share();
        let mut asked = Vec::new();
        for (&id, a) in &mut self.accounts {
            if a.grants <= fair {
                a.reclaiming = 0;
                continue;
            }
            let excess = a.grants - fair;
            if excess > a.reclaiming {
                a.line.reclaim(excess - a.reclaiming);
                a.reclaiming = excess;
                asked.push(id);
            }
        }
        asked
    }

    /// Grants a worker must know of before new ones are held back: half of
    /// what it may hold, at least one.
    fn low_water(&self) -> u32 {
        (self.prefetch.min(self.fair_share()) / 2).max(1)
    }
}

/// Whether `account`'s new grants can wait for more to join them: its worker
/// still knows of more than `low_water` grants it has not reported, so it is
/// busy for a while yet. Each write wakes the worker's socket reader (on a
/// virtual machine an interrupt to another CPU, paid by the writer), so
/// grants go out a few at a time instead of one per freed slot; the worker
/// always keeps at least `low_water` (at least one) to write into, so
/// holding back never stalls it.
fn hold_back(account: &Account, low_water: u32) -> bool {
    let queued = account.line.queued();
    queued > 0 && account.grants.saturating_sub(queued) > low_water
}

/// The credit a batch from the ring owes its connection until the consumer
/// yields it (or drops it as a copy).
#[derive(Debug)]
pub struct SlotCredit {
    book: Arc<Book>,
    conn: ConnId,
}

impl SlotCredit {
    /// The credit of a batch `conn` just filled.
    #[inline]
    pub(crate) fn new(book: Arc<Book>, conn: ConnId) -> Self {
        Self { book, conn }
    }

    /// The batch was yielded: the connection may be granted another slot.
    #[inline]
    pub fn give_back(self) {
        self.book.yielded(self.conn);
    }

    /// The ring connection the credit belongs to.
    #[inline]
    pub fn conn(&self) -> ConnId {
        self.conn
    }
}

/// The user's hold on one filled slot: the slot is `Held` exactly as long as
/// this lives, and freed (then granted again) when it is dropped.
#[derive(Debug)]
pub(crate) struct SlotRelease {
    book: Arc<Book>,
    slot: u32,
    generation: u64,
}

impl SlotRelease {
    /// The slot held.
    pub(crate) fn slot(&self) -> u32 {
        self.slot
    }
}

impl Drop for SlotRelease {
    fn drop(&mut self) {
        self.book.release(self.slot, self.generation);
    }
}

#[cfg(test)]
mod tests;
