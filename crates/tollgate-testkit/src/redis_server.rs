//! Throwaway `redis-server` processes on free loopback ports (owned by the
//! Redis backend work; see issue 3).
