//! Where the tests find PostgreSQL: `PALISADE_TEST_POSTGRES_URL`, which `scripts/test` sets
//! after starting a throwaway server on loopback. These tests fail (they do not skip) when it
//! is missing, so a green run always means they ran against a real database.

#![allow(dead_code)]

pub fn postgres_url() -> String {
    std::env::var("PALISADE_TEST_POSTGRES_URL").expect(
        "PALISADE_TEST_POSTGRES_URL is not set: run ./scripts/test, which starts a throwaway \
         PostgreSQL on loopback and sets it",
    )
}
