//! Live fan-out of a run's events to this replica's watchers (stream subscribers and waiters):
//! a broadcast per watched run. Events committed here are delivered with their payload; wake-ups
//! from other replicas and the safety poll (see `crate::notify`) tell watchers what the store
//! holds, and they read the rest from it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use antler_proto::runs::run_event::Kind;
use antler_proto::runs::{RunEvent, RunStatus};
use tokio::sync::broadcast;

/// What a watcher of a run receives.
#[derive(Debug, Clone)]
pub enum Live {
    /// An event committed by this replica, in seq order (a watcher that sees a gap reads the store).
    /// Shared: every watcher's copy of the broadcast is a reference count, not the event.
    Event(Arc<RunEvent>),
    /// The store holds the run's events up to `seq`: written by another replica (a notification) or
    /// found by the safety poll. `end`: the run has ended (its END is stored) or is gone. `status`,
    /// when known (safety poll), is the run's current status.
    Stored { seq: u64, end: bool, status: Option<RunStatus> },
    /// Notifications may have been missed (the listener reconnected): read the store.
    Resync,
}

/// One watched run.
#[derive(Debug)]
struct Channel {
    sender: broadcast::Sender<Live>,
    /// The highest seq announced to this run's watchers (published here or notified).
    known: u64,
    /// The run's status as the safety poll last saw it.
    status: Option<RunStatus>,
    /// The end was announced (not announced again unless new events appear).
    ended: bool,
    /// The safety poll has seen this run since it was first watched.
    polled: bool,
}

/// Live fan-out to this replica's watchers of runs: subscribers and waiters.
#[derive(Debug)]
pub struct EventHub {
    channels: Mutex<HashMap<String, Channel>>,
    capacity: usize,
}

impl EventHub {
    pub fn new(capacity: usize) -> Self {
        Self { channels: Mutex::new(HashMap::new()), capacity }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Channel>> {
        self.channels.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Delivers events committed here to live watchers (call after the transaction commits).
    pub fn publish(&self, events: &[RunEvent]) {
        let mut channels = self.lock();
        for event in events {
            if let Some(channel) = channels.get_mut(&event.run_id) {
                channel.known = channel.known.max(event.seq);
                let _ = channel.sender.send(Live::Event(Arc::new(event.clone())));
                // The run's channel closes with its END: a watcher whose END was filtered out of what
                // it reads (or lay before its after_seq) learns the run is over from the closing.
                if matches!(event.kind, Some(Kind::End(_))) || channel.sender.receiver_count() == 0 {
                    channels.remove(&event.run_id);
                }
            }
        }
    }

    /// The store holds `run_id`'s events up to `seq` (see [`Live::Stored`]). Returns whether any
    /// watcher was woken: a notification of events this replica already delivered wakes nobody.
    pub fn stored(&self, run_id: &str, seq: u64, end: bool, status: Option<RunStatus>) -> bool {
        let mut channels = self.lock();
        let Some(channel) = channels.get_mut(run_id) else { return false };
        let newer = seq > channel.known;
        let ending = end && !channel.ended;
        let changed = status.is_some() && status != channel.status;
        if !(newer || ending || changed) {
            return false;
        }
        channel.known = channel.known.max(seq);
        channel.ended |= end;
        if status.is_some() {
            channel.status = status;
        }
        channel.sender.send(Live::Stored { seq, end, status }).is_ok()
    }

    /// What the safety poll read of a watched run: wakes its watchers like [`Self::stored`]. Returns
    /// whether the poll found something no wake-up had announced. The first poll of a run counts as
    /// finding nothing: what its watchers read when they joined is not known here, so its news may be
    /// old (waking them then costs them no query).
    pub fn polled(&self, run_id: &str, seq: u64, end: bool, status: Option<RunStatus>) -> bool {
        let (first, news) = {
            let mut channels = self.lock();
            let Some(channel) = channels.get_mut(run_id) else { return false };
            (!std::mem::replace(&mut channel.polled, true), seq > channel.known || (end && !channel.ended))
        };
        self.stored(run_id, seq, end, status) && news && !first
    }

    /// Wakes every watcher to read the store (notifications may have been missed).
    pub fn resync_all(&self) {
        for channel in self.lock().values() {
            let _ = channel.sender.send(Live::Resync);
        }
    }

    /// The watched runs (for the safety poll).
    pub fn watched(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    /// Starts watching `run_id`; the watch ends when the returned value is dropped. Register before
    /// reading the store, so nothing committed after the read goes unannounced.
    pub fn watch(self: &Arc<Self>, run_id: &str) -> Watch {
        Watch { receiver: self.subscribe(run_id), hub: self.clone(), run_id: run_id.to_owned() }
    }

    fn subscribe(&self, run_id: &str) -> broadcast::Receiver<Live> {
        let mut channels = self.lock();
        channels
            .entry(run_id.to_owned())
            .or_insert_with(|| Channel { sender: broadcast::channel(self.capacity).0, known: 0, status: None, ended: false, polled: false })
            .sender
            .subscribe()
    }

    fn release(&self, run_id: &str) {
        let mut channels = self.lock();
        if channels.get(run_id).is_some_and(|c| c.sender.receiver_count() == 0) {
            channels.remove(run_id);
        }
    }
}

/// A registration of interest in one run's wake-ups (see [`EventHub::watch`]).
#[derive(Debug)]
pub struct Watch {
    receiver: broadcast::Receiver<Live>,
    hub: Arc<EventHub>,
    run_id: String,
}

/// What [`Watch::next`] saw.
#[derive(Debug)]
pub enum Wake {
    Live(Live),
    /// Wake-ups were dropped because this watcher fell behind: read the store.
    Lagged,
    /// The run's channel closed (its END was published here): read the store.
    Closed,
}

impl Watch {
    /// The next wake-up. After [`Wake::Closed`] the watch is registered again, so a caller that goes
    /// on waiting misses nothing.
    pub async fn next(&mut self) -> Wake {
        match self.receiver.recv().await {
            Ok(live) => Wake::Live(live),
            Err(broadcast::error::RecvError::Lagged(_)) => Wake::Lagged,
            Err(broadcast::error::RecvError::Closed) => {
                self.receiver = self.hub.subscribe(&self.run_id);
                Wake::Closed
            }
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        // The receiver must be gone before the count is checked.
        let closed = broadcast::channel(1).1;
        drop(std::mem::replace(&mut self.receiver, closed));
        self.hub.release(&self.run_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_notification_of_events_already_published_here_wakes_nobody() {
        let hub = Arc::new(EventHub::new(16));
        let mut watch = hub.watch("r");
        let event = RunEvent { run_id: "r".into(), seq: 1, ..Default::default() };
        hub.publish(std::slice::from_ref(&event));
        assert!(matches!(watch.next().await, Wake::Live(Live::Event(e)) if e.seq == 1));
        assert!(!hub.stored("r", 1, false, None), "its own write coming back");
        assert!(hub.stored("r", 2, false, None), "another replica's write");
        assert!(matches!(watch.next().await, Wake::Live(Live::Stored { seq: 2, end: false, .. })));
        assert!(hub.stored("r", 2, true, None), "the end is news");
        assert!(!hub.stored("r", 2, true, None), "announced once");
        assert!(!hub.stored("other", 5, true, None), "an unwatched run wakes nobody");
        drop(watch);
        assert!(hub.watched().is_empty(), "the last watcher gone, the run is no longer watched");
    }
}
