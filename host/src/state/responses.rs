//! Stored `/v1/responses` answers: a bounded in-memory store, so that `previous_response_id`
//! can continue a conversation and `GET /v1/responses/{id}` can retrieve one.

use serde_json::Value;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How many stored responses the store keeps by default.
pub const STORE_CAPACITY: usize = 256;

/// How long a stored response stays retrievable by default.
pub const STORE_TTL: Duration = Duration::from_secs(3600);

/// One stored response: the object as answered and the conversation it ends.
#[derive(Debug)]
pub struct StoredResponse {
    /// The response object, as `GET /v1/responses/{id}` answers it.
    pub response: Value,
    /// The conversation's items up to and including this response's output items (without
    /// `instructions`, which a continuation does not inherit).
    pub conversation: Vec<Value>,
}

struct StoreEntry {
    id: String,
    at: Instant,
    stored: Arc<StoredResponse>,
}

/// Recent stored responses, bounded in count and age, oldest dropped first.
pub struct ResponseStore {
    entries: Mutex<VecDeque<StoreEntry>>,
    capacity: usize,
    ttl: Duration,
    id_base: u64,
    next_id: AtomicU64,
}

impl Default for ResponseStore {
    fn default() -> Self {
        ResponseStore::with_limits(STORE_CAPACITY, STORE_TTL)
    }
}

impl ResponseStore {
    /// A store keeping at most `capacity` responses, each for at most `ttl`.
    pub fn with_limits(capacity: usize, ttl: Duration) -> ResponseStore {
        let id_base = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        ResponseStore {
            entries: Mutex::new(VecDeque::new()),
            capacity: capacity.max(1),
            ttl,
            id_base,
            next_id: AtomicU64::new(1),
        }
    }

    /// A fresh response id (`resp_...`), unique within this server and unlikely to repeat
    /// across restarts.
    pub fn new_id(&self) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("resp_{:016x}{n:08x}", self.id_base)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<StoreEntry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps a response under `id` (replacing one with the same id).
    pub fn insert(&self, id: &str, stored: StoredResponse) {
        self.insert_at(id, stored, Instant::now());
    }

    fn insert_at(&self, id: &str, stored: StoredResponse, now: Instant) {
        let mut entries = self.lock();
        self.expire(&mut entries, now);
        entries.retain(|e| e.id != id);
        while entries.len() >= self.capacity {
            entries.pop_front();
        }
        entries.push_back(StoreEntry {
            id: id.to_string(),
            at: now,
            stored: Arc::new(stored),
        });
    }

    /// The response stored under `id`, unless it is unknown or expired.
    pub fn get(&self, id: &str) -> Option<Arc<StoredResponse>> {
        self.get_at(id, Instant::now())
    }

    fn get_at(&self, id: &str, now: Instant) -> Option<Arc<StoredResponse>> {
        let mut entries = self.lock();
        self.expire(&mut entries, now);
        entries.iter().find(|e| e.id == id).map(|e| e.stored.clone())
    }

    /// The item (input or output) with this `id` in any stored, unexpired conversation, newest
    /// first: what an `item_reference` input item names.
    pub fn item(&self, id: &str) -> Option<Value> {
        let mut entries = self.lock();
        self.expire(&mut entries, Instant::now());
        entries
            .iter()
            .rev()
            .flat_map(|e| e.stored.conversation.iter().rev())
            .find(|item| item.get("id").and_then(Value::as_str) == Some(id))
            .cloned()
    }

    /// Forgets the response stored under `id`; whether there was one.
    pub fn remove(&self, id: &str) -> bool {
        let mut entries = self.lock();
        self.expire(&mut entries, Instant::now());
        let before = entries.len();
        entries.retain(|e| e.id != id);
        entries.len() != before
    }

    /// How many responses are kept.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no response is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn expire(&self, entries: &mut VecDeque<StoreEntry>, now: Instant) {
        while entries
            .front()
            .is_some_and(|e| now.saturating_duration_since(e.at) > self.ttl)
        {
            entries.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stored(n: usize) -> StoredResponse {
        StoredResponse {
            response: json!({"n": n}),
            conversation: vec![json!({"role": "user", "content": n.to_string()})],
        }
    }

    #[test]
    fn the_store_keeps_the_newest_responses_up_to_its_bound() {
        let store = ResponseStore::with_limits(3, Duration::from_secs(60));
        let t0 = Instant::now();
        for n in 0..5 {
            store.insert_at(&format!("resp_{n}"), stored(n), t0);
        }
        assert_eq!(store.len(), 3);
        assert!(store.get_at("resp_0", t0).is_none() && store.get_at("resp_1", t0).is_none());
        assert_eq!(store.get_at("resp_4", t0).unwrap().response["n"], 4);
        // Replacing an id does not grow the store.
        store.insert_at("resp_4", stored(44), t0);
        assert_eq!(store.len(), 3);
        assert_eq!(store.get_at("resp_4", t0).unwrap().response["n"], 44);
        assert!(store.remove("resp_3") && !store.remove("resp_3"));
        assert_eq!(store.len(), 2);
        let a = store.new_id();
        assert!(a.starts_with("resp_") && a != store.new_id());
    }

    #[test]
    fn items_are_found_by_id_in_stored_conversations() {
        let store = ResponseStore::default();
        let conversation = vec![
            json!({"type": "message", "role": "user", "content": "hi"}),
            json!({"type": "message", "id": "msg_1", "role": "assistant", "content": []}),
        ];
        store.insert(
            "resp_1",
            StoredResponse {
                response: json!({}),
                conversation,
            },
        );
        assert_eq!(store.item("msg_1").unwrap()["role"], "assistant");
        assert!(store.item("msg_2").is_none());
        store.remove("resp_1");
        assert!(store.item("msg_1").is_none());
    }

    #[test]
    fn stored_responses_expire() {
        let store = ResponseStore::with_limits(10, Duration::from_secs(60));
        let t0 = Instant::now();
        store.insert_at("resp_old", stored(0), t0);
        store.insert_at("resp_new", stored(1), t0 + Duration::from_secs(50));
        assert!(store.get_at("resp_old", t0 + Duration::from_secs(60)).is_some());
        let later = t0 + Duration::from_secs(61);
        assert!(store.get_at("resp_old", later).is_none());
        assert!(store.get_at("resp_new", later).is_some());
        assert_eq!(store.len(), 1);
        assert!(store.get_at("resp_new", t0 + Duration::from_secs(200)).is_none());
        assert!(store.is_empty());
    }
}
