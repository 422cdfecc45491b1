//! Enums stored and spoken as text: one declaration lists each variant with its text once.

/// Declares an enum whose variants are stored (and printed) as fixed texts: `ALL` (every
/// variant, in declaration order), `as_str`, `parse` and `Display`. Derives and docs are the
/// caller's, so the text is the one thing the macro adds; a column's CHECK constraint and serde's
/// spelling must agree with it (tests hold the stored ones to it).
///
/// ```
/// zuno_queue::text_enum! {
///     #[derive(Debug, Clone, Copy, PartialEq, Eq)]
///     pub enum Colour { Red = "red", DarkBlue = "dark_blue" }
/// }
/// assert_eq!(Colour::parse("dark_blue"), Some(Colour::DarkBlue));
/// assert_eq!(Colour::ALL.map(Colour::as_str), ["red", "dark_blue"]);
/// assert_eq!(Colour::Red.to_string(), "red");
/// ```
#[macro_export]
macro_rules! text_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$variant_meta:meta])* $variant:ident = $text:literal ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis enum $name {
            $( $(#[$variant_meta])* $variant ),+
        }

        impl $name {
            pub const ALL: [$name; [$($text),+].len()] = [$($name::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }

            pub fn parse(value: &str) -> Option<$name> {
                match value {
                    $($text => Some($name::$variant),)+
                    _ => None,
                }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}
