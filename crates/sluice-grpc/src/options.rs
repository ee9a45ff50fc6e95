//! APISIX's `pb_option` list (lua-protobuf options) mapped onto prost-reflect's JSON options.

use prost_reflect::SerializeOptions;

/// The JSON rendering chosen by a route's `pb_option`.
///
/// | `pb_option` | effect in Sluice |
/// |---|---|
/// | `enum_as_name` (default) / `enum_as_value` | enums as their name / their number |
/// | `int64_as_number` (default) / `int64_as_string` | 64-bit integers as JSON numbers (exact, where lua-protobuf rounds to a double) / as decimal strings (proto3 JSON; lua-protobuf prefixes `#` to big values) |
/// | `int64_as_hexstring` | refused at config time: no JSON encoder offers it and its lua-protobuf output (`"#0x..."`) is not portable |
/// | `auto_default_values` (default), `use_default_values` | proto3 fields without presence are always written (zero values, `[]`, `{}`); unset message fields are left out |
/// | `no_default_values`, `use_default_metatable` | fields holding their default value are left out (lua-protobuf's metatable defaults are invisible to cjson too) |
/// | `enable_hooks` / `disable_hooks` (default) | accepted, no effect: Sluice has no Lua hooks |
///
/// Field names are always the proto names (`type_url`, not `typeUrl`), as lua-protobuf decodes them; request
/// JSON may use either spelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PbOptions {
    pub enum_as_value: bool,
    pub int64_as_string: bool,
    pub skip_default_values: bool,
}

impl Default for PbOptions {
    /// APISIX's default: `enum_as_name, int64_as_number, auto_default_values, disable_hooks`.
    fn default() -> Self {
        PbOptions {
            enum_as_value: false,
            int64_as_string: false,
            skip_default_values: false,
        }
    }
}

impl PbOptions {
    /// Parses a route's `pb_option` list. Options not listed keep APISIX's defaults; when two options of one group
    /// are listed, the one sorting last wins, as APISIX sorts the list and applies each in turn.
    pub fn parse<S: AsRef<str>>(list: &[S]) -> Result<Self, String> {
        let mut sorted: Vec<&str> = list.iter().map(AsRef::as_ref).collect();
        sorted.sort_unstable();
        let mut o = PbOptions::default();
        for opt in sorted {
            match opt {
                "enum_as_name" => o.enum_as_value = false,
                "enum_as_value" => o.enum_as_value = true,
                "int64_as_number" => o.int64_as_string = false,
                "int64_as_string" => o.int64_as_string = true,
                "int64_as_hexstring" => return Err(
                    "pb_option int64_as_hexstring is not supported by Sluice: use int64_as_string"
                        .to_owned(),
                ),
                "auto_default_values" | "use_default_values" => o.skip_default_values = false,
                "no_default_values" | "use_default_metatable" => o.skip_default_values = true,
                "enable_hooks" | "disable_hooks" => {}
                other => return Err(format!("unknown pb_option \"{other}\"")),
            }
        }
        Ok(o)
    }

    pub(crate) fn serialize_options(&self) -> SerializeOptions {
        SerializeOptions::new()
            .use_proto_field_name(true)
            .use_enum_numbers(self.enum_as_value)
            .stringify_64_bit_integers(self.int64_as_string)
            .skip_default_fields(self.skip_default_values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_overrides() {
        assert_eq!(
            PbOptions::parse(&[
                "enum_as_name",
                "int64_as_number",
                "auto_default_values",
                "disable_hooks"
            ]),
            Ok(PbOptions::default())
        );
        let o = PbOptions::parse(&["enum_as_value"]).unwrap();
        assert!(o.enum_as_value && !o.int64_as_string && !o.skip_default_values);
        let o = PbOptions::parse(&["int64_as_string", "no_default_values"]).unwrap();
        assert!(o.int64_as_string && o.skip_default_values);
        // Sorted order decides between options of one group: "enum_as_value" sorts after "enum_as_name".
        assert!(
            PbOptions::parse(&["enum_as_value", "enum_as_name"])
                .unwrap()
                .enum_as_value
        );
    }

    #[test]
    fn refuses_hexstring_and_unknown() {
        assert!(PbOptions::parse(&["int64_as_hexstring"])
            .unwrap_err()
            .contains("int64_as_hexstring"));
        assert!(PbOptions::parse(&["bogus"]).unwrap_err().contains("bogus"));
    }
}
