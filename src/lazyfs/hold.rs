//! One fsync held inside the file system until released, so that a harness
//! can place a power loss between a write and its sync deterministically:
//! it waits for the `held` event (a channel), never for a time.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use tokio::sync::oneshot;

use super::Error;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Waiting for a matching fsync.
    Armed,
    /// An fsync is blocked on it.
    Held,
    /// Let go: the fsync goes on.
    Released,
    /// A freeze or a power loss came first: the fsync fails.
    Cancelled,
}

struct Slot {
    suffix: PathBuf,
    state: Mutex<State>,
    wake: Condvar,
    held: Mutex<Option<oneshot::Sender<PathBuf>>>,
}

impl Slot {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Moves on from `from` states only; wakes the fsync waiting on it.
    fn set(&self, from: &[State], to: State) {
        let mut state = self.state();
        if from.contains(&*state) {
            *state = to;
            self.wake.notify_all();
        }
    }
}

/// The holds a mount has armed, in the order they were asked for.
#[derive(Default)]
pub(super) struct Holds {
    slots: Mutex<Vec<Arc<Slot>>>,
}

impl Holds {
    fn slots(&self) -> MutexGuard<'_, Vec<Arc<Slot>>> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn arm(&self, suffix: &Path) -> Hold {
        let (tx, rx) = oneshot::channel();
        let slot = Arc::new(Slot {
            suffix: suffix.to_path_buf(),
            state: Mutex::new(State::Armed),
            wake: Condvar::new(),
            held: Mutex::new(Some(tx)),
        });
        self.slots().push(slot.clone());
        Hold {
            slot,
            held: Some(rx),
            seen: None,
        }
    }

    /// Called by an fsync of `path` (relative to the backing directory):
    /// if an armed hold matches it (its suffix ends the path, component by
    /// component), the hold fires and this blocks until it is released
    /// (true) or cancelled by a freeze (false). No match: true at once.
    pub(super) fn pass(&self, path: &Path) -> bool {
        let slot = {
            let mut slots = self.slots();
            slots.retain(|s| matches!(*s.state(), State::Armed | State::Held));
            let found = slots
                .iter()
                .find(|s| *s.state() == State::Armed && path.ends_with(&s.suffix));
            let Some(slot) = found.cloned() else {
                return true;
            };
            slot.set(&[State::Armed], State::Held);
            slot
        };
        let tx = slot
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(tx) = tx {
            let _ = tx.send(path.to_path_buf());
        }
        let state = slot.state();
        let state = slot
            .wake
            .wait_while(state, |s| *s == State::Held)
            .unwrap_or_else(PoisonError::into_inner);
        *state == State::Released
    }

    /// A freeze: every held fsync fails, every armed hold is dropped (its
    /// `held` reports that it never fired).
    pub(super) fn cancel_all(&self) {
        for slot in self.slots().drain(..) {
            slot.set(&[State::Armed, State::Held], State::Cancelled);
            slot.held
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
        }
    }
}

/// A hold on the next fsync of a path: see [`super::Mount::hold_next_fsync`].
/// Dropping it releases a held fsync (or disarms it), so a test that fails
/// halfway never leaves a server blocked.
pub struct Hold {
    slot: Arc<Slot>,
    held: Option<oneshot::Receiver<PathBuf>>,
    seen: Option<PathBuf>,
}

impl Hold {
    /// Waits until a matching fsync is blocked in the file system; the
    /// path it synced (relative to the backing directory).
    pub async fn held(&mut self) -> Result<PathBuf, Error> {
        if let Some(rx) = self.held.take() {
            self.seen = rx.await.ok();
        }
        self.result()
    }

    /// [`Hold::held`] for a thread outside any async runtime (it panics
    /// inside one, as tokio's `blocking_recv` does).
    pub fn wait_held(&mut self) -> Result<PathBuf, Error> {
        if let Some(rx) = self.held.take() {
            self.seen = rx.blocking_recv().ok();
        }
        self.result()
    }

    fn result(&self) -> Result<PathBuf, Error> {
        self.seen.clone().ok_or_else(|| Error::NotHeld {
            suffix: self.slot.suffix.clone(),
        })
    }

    /// Lets the held fsync go on (it then makes its file durable).
    pub fn release(self) {
        drop(self)
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.slot.set(&[State::Armed, State::Held], State::Released);
    }
}
