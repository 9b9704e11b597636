"""Symbols, primary symbol and role of chunks of code, per language, from realistic snippets.

Each snippet is what a chunk could hold: a whole definition, a header cut mid-body, the tail of a body.
Cases marked "best effort" pin behaviour the module docstring lists as a limit, so a change to it is seen.
"""

from __future__ import annotations

import time
from textwrap import dedent

import pytest

from shardfuse.pipeline.ingest.symbols import NO_SYMBOLS, ChunkSymbols, Language, Role, extract_symbols, language_for


def _py(text: str, **kwargs: bool) -> ChunkSymbols:
    return extract_symbols(dedent(text).lstrip("\n"), language="python", **kwargs)


def _of(language: str, text: str, **kwargs: bool) -> ChunkSymbols:
    return extract_symbols(dedent(text).lstrip("\n"), language=language, **kwargs)


# -- language_for ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "language"),
    [
        ("src/app/models.py", Language.PYTHON),
        ("stubs/os.pyi", Language.PYTHON),
        ("web/App.JSX", Language.JAVASCRIPT),
        ("lib/index.mjs", Language.JAVASCRIPT),
        ("ui/button.tsx", Language.TYPESCRIPT),
        ("cmd/server/main.go", Language.GO),
        ("src/lib.rs", Language.RUST),
        ("src/main/java/Foo.java", Language.JAVA),
        ("build.gradle.kts", Language.KOTLIN),
        ("Program.cs", Language.CSHARP),
        ("kernel/sched.c", Language.C),
        ("include/widget.h", Language.CPP),
        ("src/widget.cc", Language.CPP),
        ("README.md", None),
        ("docs/guide.txt", None),
        ("Makefile", None),
        (".py", None),  # a dotfile named ".py" has no extension
        ("archive.tar.gz", None),
    ],
)
def test_language_is_chosen_by_extension(path: str, language: Language | None) -> None:
    assert language_for(path) == language


# -- the result and its stored form ---------------------------------------------------------------------


def test_prose_and_unknown_languages_define_nothing() -> None:
    prose = "The shard store replaces a document's chunks in one transaction.\nReaders never see a mix.\n"
    assert extract_symbols(prose, language=None) == NO_SYMBOLS
    assert extract_symbols(prose, language="cobol") == NO_SYMBOLS
    assert extract_symbols(prose, language="python") == NO_SYMBOLS
    assert extract_symbols("", language="python") == NO_SYMBOLS
    assert NO_SYMBOLS.to_json() is None


def test_json_form_round_trips_and_tolerates_what_it_does_not_know() -> None:
    symbols = ChunkSymbols(symbols=("Cache", "get"), primary_symbol="Cache", role=Role.DECLARATION)
    data = symbols.to_json()
    assert data == {"symbols": ["Cache", "get"], "primary": "Cache", "role": "declaration"}
    assert ChunkSymbols.from_json(data) == symbols
    assert ChunkSymbols.from_json(None) == NO_SYMBOLS
    assert ChunkSymbols.from_json({"symbols": ["x"], "primary": "x", "role": "unheard-of"}).role is None
    body = ChunkSymbols(role=Role.BODY)
    assert body.to_json() == {"symbols": [], "primary": None, "role": "body"}
    assert ChunkSymbols.from_json(body.to_json()) == body


# -- Python ----------------------------------------------------------------------------------------------


def test_python_complete_function_ends_at_the_dedent() -> None:
    result = _py('''
        def parse_header(line: str) -> tuple[str, str]:
            """Split one header line.

        A docstring line at column 0 does not end the function.
            """
            name, _, value = line.partition(":")
            return name.strip(), value.strip()

        HEADER_LIMIT = 8192
    ''')
    assert result == ChunkSymbols(("parse_header", "HEADER_LIMIT"), "parse_header", Role.COMPLETE)


def test_python_block_open_at_the_chunk_end_is_a_declaration_unless_the_document_ends() -> None:
    text = """
        def total(items):
            subtotal = sum(item.price for item in items)
            return subtotal * (1 + TAX)
    """
    assert _py(text).role is Role.DECLARATION  # the next chunk may hold more of its body
    assert _py(text, ends_document=True).role is Role.COMPLETE


def test_python_header_cut_mid_body_is_a_declaration() -> None:
    result = _py("""
        class RetryPolicy:
            \"\"\"Exponential backoff.\"\"\"

            def __init__(self, base: float, cap: float) -> None:
                self.base = base
                self.cap = cap

            def delay(self, attempt: int) -> float:
                if attempt <= 0:
    """)
    assert result == ChunkSymbols(("RetryPolicy", "__init__", "delay"), "RetryPolicy", Role.DECLARATION)


def test_python_body_only_continuation() -> None:
    tail = "        if attempt <= 0:\n            return 0.0\n        return min(self.cap, self.base * 2 ** attempt)\n"
    assert extract_symbols(tail, language="python") == ChunkSymbols(role=Role.BODY)
    # the tail of one method, then a whole next method: the first definition of the chunk leads
    result = _py("""
                return min(self.cap, self.base * 2 ** attempt)

            def reset(self) -> None:
                self.attempts = 0

        def make_policy() -> RetryPolicy:
    """)
    assert result == ChunkSymbols(("reset", "make_policy"), "reset", Role.COMPLETE)


def test_python_decorators_nested_defs_and_async() -> None:
    result = _py("""
        @app.route(
            "/items/<int:item_id>",
            methods=["GET"],
        )
        async def get_item(item_id):
            def render(item):
                return {"id": item.id}

            return render(await store.load(item_id))

        @functools.cache
        def settings():
            return load()
    """)
    assert result == ChunkSymbols(("get_item", "render", "settings"), "get_item", Role.COMPLETE)


def test_python_multi_line_signature_and_strings_that_look_like_code() -> None:
    result = _py('''
        def query(
            sql: str,
            *params: object,
        ) -> list[tuple]:
            template = """
        def not_a_function():
            class NotAClass: pass
        """
            note = "def fake(): {"  # def also_fake():
            return run(sql, params)

        done = True
    ''')
    assert result == ChunkSymbols(("query",), "query", Role.COMPLETE)


def test_python_constants_and_type_aliases_are_symbols_but_constants_do_not_lead() -> None:
    result = _py("""
        import re
        from typing import TypeAlias

        MAX_RETRIES = 5
        _DEFAULT_TIMEOUT: float = 2.5
        Headers: TypeAlias = dict[str, str]
        type Pair[T] = tuple[T, T]
        counter = 0

        def retry():
            pass
        x = 1
    """)
    assert result.symbols == ("MAX_RETRIES", "_DEFAULT_TIMEOUT", "Headers", "Pair", "retry")
    assert (result.primary_symbol, result.role) == ("Headers", Role.COMPLETE)  # a type outranks constants
    constants_only = _py("""
        MAX_RETRIES = 5
        LIMITS = {
            "a": 1,
        }
    """)
    assert constants_only == ChunkSymbols(("MAX_RETRIES", "LIMITS"), "MAX_RETRIES", Role.COMPLETE)
    assert _py("LIMITS = {\n    'a': 1,\n").role is Role.DECLARATION  # cut inside the literal


def test_python_imports_only_define_nothing() -> None:
    assert _py("import os\nfrom pathlib import Path\n\nlog = logging.getLogger(__name__)\n") == NO_SYMBOLS


def test_python_chunk_starting_mid_line_ignores_its_first_fragment() -> None:
    # The previous chunk holds "    async " and this one starts at "def helper...": not a header here.
    text = "def helper(x):\n        return x\n\ndef main():\n    pass\n"
    assert _py(text, starts_mid_line=True) == ChunkSymbols(("main",), "main", Role.DECLARATION)


def test_python_chunk_starting_inside_a_docstring() -> None:
    result = _py('''
            Returns:
                the parsed value.
            """
            return parse(raw)

        def other():
            """Summary."""
            return 1
    ''')
    assert result == ChunkSymbols(("other",), "other", Role.DECLARATION)


# -- JavaScript / TypeScript -----------------------------------------------------------------------------


def test_javascript_functions_arrows_and_strings_with_braces() -> None:
    result = _of("javascript", """
        // handler for {brace} events
        export async function handle(event) {
          const label = "}" + '{' + `${event.name} }`;
          /* a comment with { */
          return label;
        }

        export const double = (x) => {
          return x * 2;
        };

        const square = x => x * x
        const MAX_ITEMS = 50;
    """)
    assert result == ChunkSymbols(("handle", "double", "square", "MAX_ITEMS"), "handle", Role.COMPLETE)


def test_javascript_class_methods_but_not_control_flow() -> None:
    result = _of("javascript", """
        class Cache {
          constructor(limit) {
            this.limit = limit;
          }

          get(key) {
            if (this.map.has(key)) {
              return this.map.get(key);
            }
            for (const k of this.keys) {
              touch(k);
            }
          }

          async #evict() {
            while (this.size > this.limit) {
    """)
    assert result == ChunkSymbols(("Cache", "constructor", "get", "#evict"), "Cache", Role.DECLARATION)


def test_javascript_arrow_cut_mid_body_and_body_only() -> None:
    assert _of("javascript", "export const load = async (id) => {\n  const row = await db.get(id);\n").role is (
        Role.DECLARATION
    )
    tail = _of("javascript", """
            return rows.map((r) => r.id);
          }
        }
    """)
    assert tail == ChunkSymbols(role=Role.BODY)


def test_typescript_interfaces_types_enums_and_typed_methods() -> None:
    result = _of("typescript", """
        export interface Props {
          name: string;
          onClick: () => void;
        }
        export type Id = string | number;
        export enum Color { Red, Green }
        export abstract class Base<T> {
          protected abstract run(x: T): Promise<void>;
          async handle(x: T): Promise<void> {
            await this.run(x);
          }
        }
    """)
    # best effort: a bodiless abstract method (`run(...);`) is not told apart from a call, so not listed
    assert result == ChunkSymbols(("Props", "Id", "Color", "Base", "handle"), "Props", Role.COMPLETE)


# -- Go --------------------------------------------------------------------------------------------------


def test_go_functions_methods_and_types() -> None:
    result = _of("go", """
        package server

        type Server struct {
            addr string
            mux  map[string]Handler
        }

        func (s *Server) Handle(pattern string, h Handler) {
            s.mux[pattern] = h // a "}" in a comment
        }

        func New(addr string) *Server {
            return &Server{addr: addr, mux: map[string]Handler{}}
    """)
    assert result == ChunkSymbols(("Server", "Handle", "New"), "Server", Role.COMPLETE)
    assert _of("go", "func New(addr string) *Server {\n\treturn &Server{addr: addr}\n").role is Role.DECLARATION


# -- Rust ------------------------------------------------------------------------------------------------


def test_rust_items_impls_lifetimes_and_char_literals() -> None:
    result = _of("rust", """
        pub struct Token<'a> { text: &'a str }

        pub enum Kind { Open, Close }

        impl<'a> fmt::Display for Token<'a> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let brace = '{';
                write!(f, "{}{}", brace, self.text)
            }
        }

        pub trait Lexer {
            fn next_token(&mut self) -> Option<Token<'_>>;
        }

        const MAX_DEPTH: usize = 64;
    """)
    assert result.symbols == ("Token", "Kind", "fmt", "Lexer", "next_token", "MAX_DEPTH")
    assert (result.primary_symbol, result.role) == ("Token", Role.COMPLETE)


def test_rust_function_cut_mid_body() -> None:
    result = _of("rust", """
        pub(crate) async fn fetch(url: &str) -> Result<Vec<u8>, Error> {
            let resp = client.get(url).send().await?;
            if resp.status().is_success() {
    """)
    assert result == ChunkSymbols(("fetch",), "fetch", Role.DECLARATION)


# -- Java, C#, Kotlin ------------------------------------------------------------------------------------


def test_java_class_methods_and_interfaces() -> None:
    result = _of("java", """
        public class OrderService extends Base implements Service {
            private static final int MAX_ITEMS = 100;

            @Override
            public String toString() {
                return "OrderService{" + id + "}";
            }

            public static void main(String[] args) throws IOException {
                Runnable r = new Runnable() {
                    public void run() { log("ran"); }
                };
                return process(args);
            }
        }

        interface Greeter {
            void greet(String name);
        }
    """)
    assert result.symbols == ("OrderService", "MAX_ITEMS", "toString", "main", "run", "Greeter", "greet")
    assert (result.primary_symbol, result.role) == ("OrderService", Role.COMPLETE)


def test_java_body_chunk_inside_a_class() -> None:
    result = _of("java", """
                    items.add(item);
                }
                return items;
            }
    """)
    assert result == ChunkSymbols(role=Role.BODY)


def test_csharp_expression_bodied_members_and_constructors() -> None:
    result = _of("csharp", """
        public class Calculator
        {
            public int Add(int a, int b) => a + b;

            public Calculator(int seed) : base(seed)
            {
            }
        }
    """)
    # the constructor is named like its class: one symbol
    assert result == ChunkSymbols(("Calculator", "Add"), "Calculator", Role.COMPLETE)


def test_kotlin_functions_and_bodiless_classes() -> None:
    result = _of("kotlin", """
        data class User(val name: String)

        fun greet(user: User): String = "Hello ${user.name}"

        class Repo(private val db: Db) {
            fun find(id: Int): User? {
                return db.get(id)
            }
        }
    """)
    assert result == ChunkSymbols(("User", "greet", "Repo", "find"), "User", Role.COMPLETE)


# -- C / C++ ---------------------------------------------------------------------------------------------


def test_c_definitions_not_prototypes_or_macros() -> None:
    result = _of("c", """
        #include <stdio.h>
        #define OPEN_BLOCK {

        static int count_lines(const char *s);

        static int
        count_lines(const char *s)
        {
            int n = 0;
            for (; *s; s++)
                if (*s == '\\n' || *s == '{')
                    n++;
            return n;
        }

        int main(int argc, char **argv) {
            printf("%d }\\n", count_lines(argv[1]));
    """)
    assert result == ChunkSymbols(("count_lines", "main"), "count_lines", Role.COMPLETE)


def test_cpp_classes_qualified_methods_and_forward_declarations() -> None:
    result = _of("cpp", """
        class Renderer;

        namespace ui {
        class Widget : public Base {
        public:
            void draw() const override {
                render();
            }
        };

        int Widget::size() const {
            return 1;
        }
        }  // namespace ui
    """)
    assert result == ChunkSymbols(("Widget", "draw", "size"), "Widget", Role.COMPLETE)


def test_headers_stop_being_tried_only_where_no_tail_can_end() -> None:
    # Past the last "{" (or ";" / "=>" for a declaration) no header can have its tail: a file of prototypes is
    # tried once, not at every line. A header right before the last one is still found.
    assert _of("c", """
        int a(void);
        int b(void);
    """) == NO_SYMBOLS
    assert _of("c", """
        int a(void);
        int b(void);
        int c(void) {
            return 0;
        }
    """).symbols == ("c",)
    assert _of("csharp", """
        class A
        {
            public int Add(int a, int b) => a + b
    """).symbols == ("A", "Add")


def test_block_comment_the_chunk_starts_inside() -> None:
    result = _of("c", """
         * still inside a comment: void fake(void) {
         */
        void real(void) {
        }
    """)
    assert result == ChunkSymbols(("real",), "real", Role.COMPLETE)


# -- speed -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("language", [lang.value for lang in Language])
def test_long_runs_of_blanks_do_not_backtrack(language: str) -> None:
    # Blanked comments are long runs of spaces. A pattern that could split them two ways and then fail
    # (here on `this.`) took 2 s per call on this text, and 30 ms on a real 1 kB JavaScript chunk.
    text = ("    " * 60 + "\n") * 40 + "    this.items.push(item);\n"
    started = time.perf_counter()
    for _ in range(20):
        extract_symbols(text, language=language, starts_mid_line=True)
    assert time.perf_counter() - started < 1.0
