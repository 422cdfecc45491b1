//! The Experience aggregate's shared SQL conditions, written once: every query that asks for
//! "live" experience (recall, mining, Memory support, maintenance) uses these, so a change to
//! what keeps an experience usable is one edit.

/// An experience that may still be used: not forgotten or superseded (`status = 'active'`) and
/// its source unchanged since extraction (`source_state = 'current'`). A string literal, so it
/// composes with `concat!` into `&'static str` statements: `live_experience!()` for an
/// unaliased `experience_record`, `live_experience!("e")` for one aliased `e`.
macro_rules! live_experience {
    () => {
        "status = 'active' AND source_state = 'current'"
    };
    ($alias:literal) => {
        concat!(
            $alias,
            ".status = 'active' AND ",
            $alias,
            ".source_state = 'current'"
        )
    };
}
pub(crate) use live_experience;

/// A live experience that may be evidence for a rule: verified, and never an unresolved issue (an
/// issue nobody solved teaches no rule). Aliased like [`live_experience!`].
macro_rules! evidence_experience {
    () => {
        concat!(
            $crate::learning::experience::store::live_experience!(),
            " AND verification = 'verified' AND kind <> 'unresolved_issue'"
        )
    };
    ($alias:literal) => {
        concat!(
            $crate::learning::experience::store::live_experience!($alias),
            " AND ",
            $alias,
            ".verification = 'verified' AND ",
            $alias,
            ".kind <> 'unresolved_issue'"
        )
    };
}
pub(crate) use evidence_experience;

#[cfg(test)]
mod tests {
    #[test]
    fn the_conditions_read_as_sql() {
        assert_eq!(
            live_experience!("e"),
            "e.status = 'active' AND e.source_state = 'current'"
        );
        assert_eq!(
            evidence_experience!(),
            "status = 'active' AND source_state = 'current' AND verification = 'verified' \
             AND kind <> 'unresolved_issue'"
        );
    }
}
