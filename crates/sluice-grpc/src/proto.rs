//! Proto resources: compile `content` (proto text or base64 of a `FileDescriptorSet`) into a descriptor pool,
//! and look methods up the way APISIX's `grpc-transcode/proto.lua` indexes them.

use std::collections::{HashMap, HashSet};
use std::sync::OnceLock;

use base64::Engine as _;
use prost::Message as _;
use prost_reflect::{DescriptorPool, MethodDescriptor};
use prost_types::FileDescriptorSet;
use protox::file::{File, FileResolver, GoogleFileResolver};

/// Import paths Sluice bundles besides the `google/protobuf` well-known types that protox ships.
/// The files are Sluice's own minimal definitions with googleapis' field names and numbers (the wire contract),
/// not copies of googleapis' text.
const BUNDLED: &[(&str, &str)] = &[
    ("google/api/http.proto", include_str!("google/http.proto")),
    (
        "google/api/annotations.proto",
        include_str!("google/annotations.proto"),
    ),
    (
        "google/api/httpbody.proto",
        include_str!("google/httpbody.proto"),
    ),
    (
        "google/rpc/status.proto",
        include_str!("google/status.proto"),
    ),
    ("google/rpc/code.proto", include_str!("google/code.proto")),
    (
        "google/rpc/error_details.proto",
        include_str!("google/error_details.proto"),
    ),
];

/// The bundled `google/api` and `google/rpc` files as `(import path, text)`, e.g. to give `protoc` the same
/// include tree when building a descriptor set.
pub fn bundled_files() -> &'static [(&'static str, &'static str)] {
    BUNDLED
}

/// Why a proto resource's `content` was refused. `Display` is the compiler's message, ready for the Admin API's
/// `{"error_msg":"invalid content: ..."}` (APISIX's wording around it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CompileError(pub String);

/// A method that cannot be found in a compiled proto (APISIX answers 503 "Undefined service method" at request
/// time; Sluice refuses the route at config time with the same words).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Undefined service method: {service}/{method} end")]
pub struct LookupError {
    pub service: String,
    pub method: String,
}

/// How a proto resource's `content` was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentKind {
    /// `.proto` source text.
    Text,
    /// Base64 of a binary `FileDescriptorSet` (`protoc --include_imports --descriptor_set_out`).
    DescriptorSet,
}

/// A compiled proto resource. Cheap to clone: the descriptor pool is reference counted inside.
#[derive(Debug, Clone)]
pub struct ProtoSet {
    pool: DescriptorPool,
    kind: ContentKind,
}

impl ProtoSet {
    /// The descriptor pool (all files of the resource, its imports and the bundled files it uses).
    pub fn pool(&self) -> &DescriptorPool {
        &self.pool
    }

    /// How the content was read.
    pub fn kind(&self) -> ContentKind {
        self.kind
    }

    /// Finds `method` of `service`, where `service` is package-qualified (`helloworld.Greeter`), as in APISIX's
    /// index (`package .. '.' .. service.name`). A service of a file without a package is found by its bare name.
    pub fn method(&self, service: &str, method: &str) -> Result<MethodDescriptor, LookupError> {
        self.pool
            .get_service_by_name(service)
            .and_then(|s| s.methods().find(|m| m.name() == method))
            .ok_or_else(|| LookupError {
                service: service.to_owned(),
                method: method.to_owned(),
            })
    }
}

/// Compiles a proto resource's `content`.
///
/// As APISIX (`compile_proto` in `grpc-transcode/proto.lua`): the content is first compiled as `.proto` text;
/// if that fails it is tried as base64 of a `FileDescriptorSet`; if that fails too, the *text* compiler's error
/// is returned (a typo in a proto file should be reported as such, not as "bad base64").
///
/// `name` is the file name the text is compiled under (the resource's `name`, or its id): it appears in error
/// messages and other resources may import it. `resolver` maps an import path to the text of another proto
/// resource (Sluice resolves imports against resources whose `name` equals the import path; APISIX cannot import
/// at all). Imports of `google/protobuf/*.proto`, `google/api/{annotations,http,httpbody}.proto` and
/// `google/rpc/{status,code,error_details}.proto` are bundled and need no resource.
pub fn compile(
    name: &str,
    content: &str,
    resolver: impl Fn(&str) -> Option<String>,
) -> Result<ProtoSet, CompileError> {
    let text_err = match compile_text(name, content, &resolver) {
        Ok(pool) => {
            return Ok(ProtoSet {
                pool,
                kind: ContentKind::Text,
            })
        }
        Err(e) => e,
    };
    match compile_descriptor_set(content) {
        Some(Ok(pool)) => Ok(ProtoSet {
            pool,
            kind: ContentKind::DescriptorSet,
        }),
        // It was base64 of a descriptor set whose descriptors are inconsistent: that error is the useful one.
        Some(Err(e)) => Err(e),
        None => Err(text_err),
    }
}

/// Files gathered before compiling: protox wants a `'static` resolver, the caller's is borrowed.
struct Gathered(HashMap<String, File>);

impl FileResolver for Gathered {
    fn open_file(&self, name: &str) -> Result<File, protox::Error> {
        self.0
            .get(name)
            .cloned()
            .ok_or_else(|| protox::Error::file_not_found(name))
    }
}

fn open_import(
    name: &str,
    resolver: &impl Fn(&str) -> Option<String>,
) -> Result<File, protox::Error> {
    // The well-known types come first so that no resource can shadow google.protobuf.
    if name.starts_with("google/protobuf/") {
        return GoogleFileResolver::new().open_file(name);
    }
    if let Some(text) = resolver(name) {
        return File::from_source(name, &text);
    }
    if let Some((_, text)) = BUNDLED.iter().find(|(n, _)| *n == name) {
        return File::from_source(name, text);
    }
    Err(protox::Error::file_not_found(name))
}

/// Parses `root` and, transitively, every import it names (bounded: each name once, at most 256 files).
fn gather(
    root_name: &str,
    root: &str,
    resolver: &impl Fn(&str) -> Option<String>,
) -> Result<Gathered, protox::Error> {
    const MAX_FILES: usize = 256;
    let mut files = HashMap::new();
    let mut queue = vec![(root_name.to_owned(), File::from_source(root_name, root)?)];
    while let Some((name, file)) = queue.pop() {
        for dep in &file.file_descriptor_proto().dependency {
            if files.contains_key(dep) || *dep == name || queue.iter().any(|(n, _)| n == dep) {
                continue;
            }
            if files.len() + queue.len() >= MAX_FILES {
                return Err(protox::Error::new(std::io::Error::other(format!(
                    "too many imported files (more than {MAX_FILES})"
                ))));
            }
            let f = open_import(dep, resolver)?;
            queue.push((dep.clone(), f));
        }
        files.insert(name, file);
    }
    Ok(Gathered(files))
}

fn compile_text(
    name: &str,
    content: &str,
    resolver: &impl Fn(&str) -> Option<String>,
) -> Result<DescriptorPool, CompileError> {
    let name = if name.is_empty() { "proto" } else { name };
    let err = |e: protox::Error| CompileError(format_protox_error(&e));
    let mut compiler =
        protox::Compiler::with_file_resolver(gather(name, content, resolver).map_err(err)?);
    compiler.include_imports(true).include_source_info(false);
    compiler.open_file(name).map_err(err)?;
    Ok(compiler.descriptor_pool())
}

fn format_protox_error(e: &protox::Error) -> String {
    // protox's Display names the problem; its file name and position live in miette's span data.
    let msg = e.to_string();
    match e.file() {
        Some(file) if !msg.contains(file) => format!("{file}: {msg}"),
        _ => msg,
    }
}

/// `None`: not base64 of a descriptor set at all. `Some(Err)`: a descriptor set that does not link.
fn compile_descriptor_set(content: &str) -> Option<Result<DescriptorPool, CompileError>> {
    // APISIX uses ngx.decode_base64 (standard alphabet, padding required); whitespace around it is tolerated
    // since a pasted `base64` output ends with a newline.
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(content.trim())
        .ok()?;
    let set = FileDescriptorSet::decode(bytes.as_slice()).ok()?;
    if set.file.is_empty() {
        return None;
    }
    Some(link_descriptor_set(&set, &bytes))
}

/// `set` is `bytes` decoded, used only for file names and dependencies: the pool is built from `bytes` so that
/// options keep their extensions (`google.api.http`), which prost-types' structs drop.
fn link_descriptor_set(
    set: &FileDescriptorSet,
    bytes: &[u8],
) -> Result<DescriptorPool, CompileError> {
    // A set built without --include_imports lacks the bundled dependencies: supply the missing ones.
    let present: HashSet<&str> = set.file.iter().filter_map(|f| f.name.as_deref()).collect();
    let mut missing: Vec<String> = Vec::new();
    for f in &set.file {
        for dep in &f.dependency {
            if !present.contains(dep.as_str()) && !missing.contains(dep) {
                missing.push(dep.clone());
            }
        }
    }
    let mut pool = DescriptorPool::new();
    let bundled = bundled_pool();
    let mut added: HashSet<String> = HashSet::new();
    for dep in &missing {
        add_with_deps(&mut pool, bundled, dep, &present, &mut added)?;
    }
    pool.decode_file_descriptor_set(bytes)
        .map_err(|e| CompileError(format!("invalid descriptor set: {e}")))?;
    Ok(pool)
}

fn add_with_deps(
    pool: &mut DescriptorPool,
    bundled: &DescriptorPool,
    name: &str,
    present: &HashSet<&str>,
    added: &mut HashSet<String>,
) -> Result<(), CompileError> {
    if present.contains(name) || added.contains(name) {
        return Ok(());
    }
    let global = DescriptorPool::global();
    let Some(file) = bundled
        .get_file_by_name(name)
        .or_else(|| global.get_file_by_name(name))
    else {
        // Left to the linker, which reports the unresolved import by name.
        return Ok(());
    };
    for dep in file.dependencies() {
        add_with_deps(pool, bundled, dep.name(), present, added)?;
    }
    pool.add_file_descriptor_proto(file.file_descriptor_proto().clone())
        .map_err(|e| CompileError(format!("invalid descriptor set: {e}")))?;
    added.insert(name.to_owned());
    Ok(())
}

/// The bundled files and the well-known types, compiled once.
pub(crate) fn bundled_pool() -> &'static DescriptorPool {
    static POOL: OnceLock<DescriptorPool> = OnceLock::new();
    POOL.get_or_init(|| {
        let mut files = HashMap::new();
        for (name, _) in BUNDLED {
            let g = gather(
                name,
                BUNDLED.iter().find(|(n, _)| n == name).unwrap().1,
                &|_| None,
            )
            .expect("bundled google protos parse");
            files.extend(g.0);
        }
        let mut compiler = protox::Compiler::with_file_resolver(Gathered(files));
        compiler.include_imports(true).include_source_info(false);
        for (name, _) in BUNDLED {
            compiler
                .open_file(name)
                .expect("bundled google protos compile");
        }
        compiler.descriptor_pool()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HELLO: &str = r#"
        syntax = "proto3";
        package helloworld;
        service Greeter { rpc SayHello (HelloRequest) returns (HelloReply) {} }
        message HelloRequest { string name = 1; }
        message HelloReply { string message = 1; }
    "#;

    fn no_imports(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn compiles_text_and_finds_method() {
        let set = compile("1", HELLO, no_imports).unwrap();
        assert_eq!(set.kind(), ContentKind::Text);
        let m = set.method("helloworld.Greeter", "SayHello").unwrap();
        assert_eq!(m.input().full_name(), "helloworld.HelloRequest");
        assert_eq!(m.output().full_name(), "helloworld.HelloReply");
    }

    #[test]
    fn lookup_errors_use_apisix_words() {
        let set = compile("1", HELLO, no_imports).unwrap();
        let e = set.method("helloworld.Greeter", "Nope").unwrap_err();
        assert_eq!(
            e.to_string(),
            "Undefined service method: helloworld.Greeter/Nope end"
        );
        // The index is package-qualified: the bare service name is not found.
        assert!(set.method("Greeter", "SayHello").is_err());
    }

    #[test]
    fn syntax_error_reports_compiler_message() {
        let e = compile(
            "bad.proto",
            "syntax = \"proto3\"; message A { string a = 1 }",
            no_imports,
        )
        .unwrap_err();
        assert!(e.0.contains("bad.proto"), "{e}");
        assert!(e.0.to_lowercase().contains("expected"), "{e}");
    }

    #[test]
    fn unknown_import_is_an_error_naming_it() {
        let e = compile(
            "a.proto",
            "syntax = \"proto3\"; import \"other/b.proto\"; message A { B b = 1; }",
            no_imports,
        )
        .unwrap_err();
        assert!(e.0.contains("other/b.proto"), "{e}");
    }

    #[test]
    fn imports_resolve_against_other_resources_and_bundled_files() {
        let b = "syntax = \"proto3\"; package other; message B { string v = 1; }";
        let a = r#"
            syntax = "proto3";
            package pkg;
            import "other/b.proto";
            import "google/api/annotations.proto";
            import "google/protobuf/timestamp.proto";
            import "google/rpc/status.proto";
            service S {
              rpc Get (other.B) returns (google.protobuf.Timestamp) {
                option (google.api.http) = { get: "/v1/{v}" };
              }
            }
            message Unused { google.rpc.Status s = 1; }
        "#;
        let set = compile("a.proto", a, |n| {
            (n == "other/b.proto").then(|| b.to_owned())
        })
        .unwrap();
        let m = set.method("pkg.S", "Get").unwrap();
        assert_eq!(m.input().full_name(), "other.B");
    }

    #[test]
    fn resources_cannot_shadow_well_known_types() {
        let evil =
            "syntax = \"proto3\"; package google.protobuf; message Timestamp { string x = 1; }";
        let a = "syntax = \"proto3\"; import \"google/protobuf/timestamp.proto\"; \
                 message A { google.protobuf.Timestamp t = 1; }";
        let set = compile("a.proto", a, |_| Some(evil.to_owned())).unwrap();
        let ts = set
            .pool()
            .get_message_by_name("google.protobuf.Timestamp")
            .unwrap();
        assert!(ts.get_field_by_name("seconds").is_some());
    }

    #[test]
    fn import_cycle_is_an_error() {
        let a = "syntax = \"proto3\"; import \"b.proto\"; message A {}";
        let b = "syntax = \"proto3\"; import \"a.proto\"; message B {}";
        let e = compile("a.proto", a, |n| (n == "b.proto").then(|| b.to_owned())).unwrap_err();
        assert!(
            e.0.to_lowercase().contains("cycle") || e.0.contains("a.proto"),
            "{e}"
        );
    }

    fn descriptor_set_b64(text: &str) -> String {
        let set = compile("hello.proto", text, no_imports).unwrap();
        let fds = FileDescriptorSet {
            file: set
                .pool()
                .files()
                .filter(|f| f.name() == "hello.proto")
                .map(|f| f.file_descriptor_proto().clone())
                .collect(),
        };
        base64::engine::general_purpose::STANDARD.encode(fds.encode_to_vec())
    }

    #[test]
    fn compiles_base64_descriptor_set() {
        let b64 = descriptor_set_b64(HELLO);
        let set = compile("1", &b64, no_imports).unwrap();
        assert_eq!(set.kind(), ContentKind::DescriptorSet);
        set.method("helloworld.Greeter", "SayHello").unwrap();
        // With a trailing newline, as `base64 file.pb` prints it.
        compile("1", &format!("{b64}\n"), no_imports).unwrap();
    }

    #[test]
    fn descriptor_set_without_included_imports_gets_bundled_ones() {
        let text = r#"
            syntax = "proto3";
            package p;
            import "google/api/annotations.proto";
            import "google/protobuf/empty.proto";
            service S { rpc M (google.protobuf.Empty) returns (google.protobuf.Empty) {
                option (google.api.http) = { post: "/m" body: "*" };
            } }
        "#;
        let set = compile("1", &descriptor_set_b64(text), no_imports).unwrap();
        let m = set.method("p.S", "M").unwrap();
        assert_eq!(m.input().full_name(), "google.protobuf.Empty");
    }

    #[test]
    fn garbage_reports_the_text_error() {
        for bad in ["", "aGVsbG8=", "not a proto", "message {"] {
            let e = compile("x.proto", bad, no_imports);
            // An empty file is a valid proto; everything else must fail with a parse message.
            if bad.is_empty() {
                assert!(e.is_ok());
            } else {
                let e = e.unwrap_err();
                assert!(!e.0.contains("descriptor set"), "{bad:?}: {e}");
            }
        }
    }
}
