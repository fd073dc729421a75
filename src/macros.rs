//! Crate-internal macros.

/// Whether the planted bug `NAME` (a static in `testkit::planted`) is switched on.
/// With the `testkit` feature a relaxed load of the flag; without it the constant
/// `false`, so release builds carry neither the flag nor the branch it guards.
macro_rules! planted {
    ($name:ident) => {{
        #[cfg(feature = "testkit")]
        let on = $crate::testkit::planted::$name.load(::std::sync::atomic::Ordering::Relaxed);
        #[cfg(not(feature = "testkit"))]
        let on = false;
        on
    }};
}
