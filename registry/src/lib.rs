//! Berth model packs and the store.
