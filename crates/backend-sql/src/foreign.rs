//! What a database holds before kine-rs opens it, looked at before anything is created or
//! written there (`kine_core::foreign`): Go kine's table `kine` (or the legacy `key_value` of
//! older kine) without kine-rs's store is refused, and so are, for SQLite, a file that is no
//! SQLite database (etcd's bbolt file, an etcd data directory, random bytes, a truncated file)
//! and a database of another program's tables. Go kine's table beside kine-rs's store (a
//! database converted in place, or both programs pointed at it) is served, with a warning.

use anyhow::{Context, Result};
use kine_core::foreign::{Foreign, ForeignKind, thousands};
use std::path::{Path, PathBuf};

/// Go kine's current table, and the one of kine before 2020 (`key_value`).
const GO_KINE_TABLE: &str = "kine";
const LEGACY_TABLE: &str = "key_value";

/// The tables that make a kine-rs store (every schema version has both).
fn has_kine_rs_store(tables: &[String]) -> bool {
    ["meta", "kv"].iter().all(|t| tables.iter().any(|n| n == t))
}

/// The first 16 bytes of every SQLite database file.
const SQLITE_MAGIC: &[u8; 16] = b"SQLite format 3\0";
/// bbolt's meta page magic (etcd's `member/snap/db`, `etcdctl snapshot save` files), at
/// offset 16 of the file (after the page header), little-endian.
const BBOLT_MAGIC: u32 = 0xED0C_DAED;

fn row_count(n: i64) -> String {
    if n == 1 { "1 row".to_string() } else { format!("{} rows", thousands(n)) }
}

fn refuse(kind: ForeignKind, found: String) -> anyhow::Error {
    anyhow::Error::new(Foreign::new(kind, found))
}

/// How a database sees Go kine's tables and whether a kine-rs store is there, then what to do.
/// `db` names the database for people ("this SQLite database", "PostgreSQL database kine").
/// `count(table)`: its rows and, for `kine`, `MAX(id)` (Go kine's revision).
fn classify(
    db: &str,
    tables: &[String],
    other_tables_refused: bool,
    mut count: impl FnMut(&str, bool) -> Result<(i64, i64)>,
) -> Result<()> {
    let has = |name: &str| tables.iter().any(|t| t == name);
    if has_kine_rs_store(tables) {
        for table in [GO_KINE_TABLE, LEGACY_TABLE].into_iter().filter(|t| has(t)) {
            let revision = if table == GO_KINE_TABLE {
                match count(table, false) {
                    Ok((_, max_id)) => format!(" (up to revision {})", thousands(max_id)),
                    Err(_) => String::new(),
                }
            } else {
                String::new()
            };
            tracing::warn!(
                "{db} holds Go kine's table {table}{revision} beside kine-rs's store: kine-rs serves its own store \
                 and not table {table}; a Go kine writing to {table} meanwhile is a split brain (kine-rs migrate \
                 converts Go kine's data into a datastore of kine-rs's)"
            );
        }
        return Ok(());
    }
    if has(GO_KINE_TABLE) {
        let (rows, revision) =
            count(GO_KINE_TABLE, true).with_context(|| format!("count the rows of table {GO_KINE_TABLE}"))?;
        return Err(refuse(
            ForeignKind::GoKine,
            format!(
                "{db} holds Go kine's data: table {GO_KINE_TABLE}, {}, revision {}",
                row_count(rows),
                thousands(revision)
            ),
        ));
    }
    if has(LEGACY_TABLE) {
        let (rows, _) = count(LEGACY_TABLE, true).with_context(|| format!("count the rows of table {LEGACY_TABLE}"))?;
        return Err(refuse(
            ForeignKind::GoKine,
            format!("{db} holds an old Go kine's data: table {LEGACY_TABLE}, {}", row_count(rows)),
        ));
    }
    if other_tables_refused && !tables.is_empty() {
        let mut names = tables.to_vec();
        names.sort();
        let shown = if names.len() > 5 {
            format!("{}, … ({} tables)", names[..5].join(", "), names.len())
        } else {
            names.join(", ")
        };
        return Err(refuse(
            ForeignKind::Other,
            format!(
                "{db} holds tables of another program ({shown}) and no kine-rs store; kine-rs creates its own \
                 only in a new or empty database"
            ),
        ));
    }
    Ok(())
}

/// Looks at the SQLite database `path` (without creating or writing anything) before kine-rs
/// opens it: `Ok` for a path where no file is yet, an empty file or database, or a kine-rs
/// database (warned about Go kine's table beside it); an error with a [`Foreign`] in its chain
/// for anything else.
pub fn check_sqlite(path: &Path) -> Result<()> {
    let shown = path.display();
    if let Some(dir) = etcd_data_dir(path) {
        let found = if absolute(path) == dir {
            format!("{shown} is etcd's data directory (it holds member/snap/db), not a SQLite database")
        } else {
            format!("{shown} is inside etcd's data directory {}, not a SQLite database", dir.display())
        };
        return Err(refuse(ForeignKind::Etcd, found));
    }
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(anyhow::Error::new(e).context(format!("read {shown}"))),
    };
    if meta.is_dir() {
        return Err(refuse(ForeignKind::Other, format!("{shown} is a directory, not a SQLite database file")));
    }
    if !meta.is_file() {
        return Err(refuse(ForeignKind::Other, format!("{shown} is not a regular file, so not a SQLite database")));
    }
    let size = meta.len();
    if size == 0 {
        return Ok(()); // SQLite's new database: kine-rs creates its store in it
    }
    let mut header = [0u8; 100];
    let read = {
        use std::io::Read;
        let mut file = std::fs::File::open(path).with_context(|| format!("open {shown} to read its header"))?;
        let mut n = 0;
        while n < header.len() {
            match file.read(&mut header[n..]).with_context(|| format!("read {shown}"))? {
                0 => break,
                k => n += k,
            }
        }
        n
    };
    if read >= 20 && u32::from_le_bytes([header[16], header[17], header[18], header[19]]) == BBOLT_MAGIC {
        return Err(refuse(
            ForeignKind::Etcd,
            format!("{shown} is an etcd database file (bbolt, as etcd's member/snap/db), not a SQLite database"),
        ));
    }
    if read < SQLITE_MAGIC.len() || &header[..16] != SQLITE_MAGIC {
        return Err(refuse(
            ForeignKind::Other,
            format!(
                "{shown} is not a SQLite database ({} bytes that do not begin with SQLite's header); nothing was \
                 written to it",
                thousands(size as i64)
            ),
        ));
    }
    if read < header.len() {
        return Err(refuse(
            ForeignKind::Other,
            format!(
                "{shown} is a truncated SQLite database ({size} bytes, less than its 100-byte header); nothing was written to it"
            ),
        ));
    }
    if let Some(damage) = header_damage(&header, size) {
        return Err(refuse(
            ForeignKind::Other,
            format!("{shown} is a damaged SQLite database ({damage}); nothing was written to it"),
        ));
    }
    let conn = open_to_look(path, &header).with_context(|| format!("open SQLite database {shown} read-only"))?;
    conn.busy_timeout(std::time::Duration::from_secs(30)).context("set busy timeout")?;
    let tables: Vec<String> = match (|| {
        let mut stmt =
            conn.prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")?;
        let names = stmt.query_map([], |r| r.get::<_, String>(0))?.collect::<rusqlite::Result<Vec<_>>>()?;
        Ok::<_, rusqlite::Error>(names)
    })() {
        Ok(t) => t,
        Err(e) if damaged(&e) => {
            return Err(refuse(
                ForeignKind::Other,
                format!("{shown} is a damaged SQLite database ({e}); nothing was written to it"),
            ));
        }
        Err(e) => return Err(anyhow::Error::new(e).context(format!("read the schema of SQLite database {shown}"))),
    };
    classify("this SQLite database", &tables, true, |table, rows| {
        let sql = match (table, rows) {
            (GO_KINE_TABLE, true) => "SELECT COUNT(*), COALESCE(MAX(id), 0) FROM kine",
            (GO_KINE_TABLE, false) => "SELECT 0, COALESCE(MAX(id), 0) FROM kine",
            _ => "SELECT COUNT(*), 0 FROM key_value",
        };
        match conn.query_row(sql, [], |r| Ok((r.get(0)?, r.get(1)?))) {
            Err(e) if damaged(&e) => Err(refuse(
                ForeignKind::Other,
                format!("{shown} is a damaged SQLite database ({e}); nothing was written to it"),
            )),
            r => Ok(r?),
        }
    })
}

/// A read-only connection that writes nothing beside the file either. A plain read-only open
/// of a database in WAL mode (`header` bytes 18 and 19: 2) creates `-shm` and `-wal` files when
/// they are missing and writes its read marks into `-shm`: with `-shm` there (a writer has it
/// open, or left it), it is opened read-only (`readonly_shm`: SQLite keeps its index in
/// memory); with neither file there is no log to read, and the file is opened `immutable`.
/// Only a log left without its index (`-wal` without `-shm`) needs the index built, in `-shm`.
pub(crate) fn open_to_look(path: &Path, header: &[u8; 100]) -> rusqlite::Result<rusqlite::Connection> {
    use rusqlite::OpenFlags;
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let beside = |suffix: &str| {
        let mut name = path.as_os_str().to_os_string();
        name.push(suffix);
        std::fs::metadata(PathBuf::from(name)).ok()
    };
    let wal_mode = header[18] == 2 || header[19] == 2;
    let parameter = match (wal_mode, beside("-shm"), beside("-wal")) {
        (false, ..) => None,
        (true, Some(_), _) => Some("readonly_shm=1"),
        (true, None, Some(wal)) if wal.len() > 0 => None,
        (true, None, _) => Some("immutable=1"),
    };
    match parameter {
        None => rusqlite::Connection::open_with_flags(path, flags),
        Some(parameter) => {
            let uri = format!("file:{}?mode=ro&{parameter}", uri_path(path));
            rusqlite::Connection::open_with_flags(uri, flags | OpenFlags::SQLITE_OPEN_URI)
        }
    }
}

/// A path as the path of a `file:` URI (every byte but the unreserved ones percent-encoded).
fn uri_path(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut out = String::new();
    for &b in path.as_os_str().as_bytes() {
        if b.is_ascii_alphanumeric() || b"/._-~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// SQLite's answer for a file that is not (or no longer) a database.
fn damaged(e: &rusqlite::Error) -> bool {
    matches!(e.sqlite_error_code(), Some(rusqlite::ErrorCode::NotADatabase | rusqlite::ErrorCode::DatabaseCorrupt))
}

/// What is wrong with a SQLite header, judged against the file's size: a page size SQLite never
/// writes, or a file shorter than the pages its header counts.
fn header_damage(header: &[u8; 100], size: u64) -> Option<String> {
    let raw = u16::from_be_bytes([header[16], header[17]]);
    let page_size: u64 = if raw == 1 { 65536 } else { u64::from(raw) };
    if !(512..=65536).contains(&page_size) || !page_size.is_power_of_two() {
        return Some(format!("page size {raw} in its header"));
    }
    let be32 = |at: usize| u32::from_be_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]]);
    // The header's page count is valid when its change counter matches "version-valid-for".
    let pages = u64::from(be32(28));
    if pages > 0 && be32(24) == be32(92) && size < pages * page_size {
        return Some(format!(
            "truncated: its header counts {pages} pages of {page_size} bytes, {} bytes, and the file has {size}",
            pages * page_size
        ));
    }
    if size < page_size {
        return Some(format!("truncated: {size} bytes, less than one page of {page_size}"));
    }
    None
}

fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// The etcd data directory `path` is or lies in: the nearest of it and its ancestors that holds
/// `member/snap/db` or `member/wal` (etcd's layout, `etcd --data-dir`).
fn etcd_data_dir(path: &Path) -> Option<PathBuf> {
    let path = absolute(path);
    path.ancestors()
        .find(|dir| dir.join("member/snap/db").is_file() || dir.join("member/wal").is_dir())
        .map(Path::to_path_buf)
}

/// PostgreSQL, before kine-rs's schema is created (the database's default schema, where kine-rs
/// and Go kine create their tables).
pub(crate) fn check_postgres(client: &mut postgres::Client) -> Result<()> {
    // Unnamed statements (`Sql`): a pooler that cannot hold prepared ones may sit in front.
    use crate::pg::conn::Sql;
    let rows = client
        .query_rows(
            "SELECT current_database()::TEXT, table_name::TEXT FROM information_schema.tables \
             WHERE table_schema = current_schema() AND table_name IN ('kine', 'key_value', 'meta', 'kv')",
            &[],
        )
        .context("read the database's tables")?;
    let tables: Vec<String> = rows.iter().map(|r| r.get(1)).collect();
    if tables.is_empty() {
        return Ok(());
    }
    let db = format!("PostgreSQL database {}", rows[0].get::<_, String>(0));
    classify(&db, &tables, false, |table, rows| {
        let sql = match (table, rows) {
            (GO_KINE_TABLE, true) => "SELECT COUNT(*)::BIGINT, COALESCE(MAX(id), 0)::BIGINT FROM kine",
            (GO_KINE_TABLE, false) => "SELECT 0::BIGINT, COALESCE(MAX(id), 0)::BIGINT FROM kine",
            _ => "SELECT COUNT(*)::BIGINT, 0::BIGINT FROM key_value",
        };
        let row = client.query_row(sql, &[])?;
        Ok((row.get(0), row.get(1)))
    })
}

/// MySQL/MariaDB, before kine-rs's schema is created.
pub(crate) fn check_mysql(conn: &mut mysql::Conn) -> Result<()> {
    use mysql::prelude::Queryable;
    let rows: Vec<(String, String)> = conn
        .query(
            "SELECT CAST(DATABASE() AS CHAR), CAST(table_name AS CHAR) FROM information_schema.tables \
             WHERE table_schema = DATABASE() AND table_name IN ('kine', 'key_value', 'meta', 'kv')",
        )
        .context("read the database's tables")?;
    let tables: Vec<String> = rows.iter().map(|(_, t)| t.clone()).collect();
    let Some((name, _)) = rows.first() else { return Ok(()) };
    let db = format!("MySQL database {name}");
    classify(&db, &tables, false, |table, rows| {
        let sql = match (table, rows) {
            (GO_KINE_TABLE, true) => "SELECT COUNT(*), CAST(COALESCE(MAX(id), 0) AS SIGNED) FROM kine",
            (GO_KINE_TABLE, false) => "SELECT 0, CAST(COALESCE(MAX(id), 0) AS SIGNED) FROM kine",
            _ => "SELECT COUNT(*), 0 FROM key_value",
        };
        let row: Option<(i64, i64)> = conn.query_first(sql)?;
        Ok(row.unwrap_or((0, 0)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(r: Result<()>) -> Option<(ForeignKind, String)> {
        r.err().map(|e| {
            let f = Foreign::find(&e).unwrap_or_else(|| panic!("no Foreign in {e:#}"));
            (f.kind, f.found.clone())
        })
    }

    fn sqlite(path: &Path, sql: &str) {
        rusqlite::Connection::open(path).unwrap().execute_batch(sql).unwrap();
    }

    const GO_KINE_SCHEMA: &str = "CREATE TABLE kine (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT, created INTEGER, \
        deleted INTEGER, create_revision INTEGER, prev_revision INTEGER, lease INTEGER, value BLOB, old_value BLOB);";

    #[test]
    fn a_new_path_or_an_empty_file_is_kine_rs_to_create() {
        let dir = kine_testkit::TempDir::new("foreign");
        check_sqlite(&dir.path().join("state.db")).unwrap();
        std::fs::write(dir.path().join("empty.db"), b"").unwrap();
        check_sqlite(&dir.path().join("empty.db")).unwrap();
        sqlite(&dir.path().join("blank.db"), "PRAGMA user_version = 1;");
        check_sqlite(&dir.path().join("blank.db")).unwrap();
    }

    #[test]
    fn go_kine_tables_without_a_kine_rs_store_are_refused() {
        let dir = kine_testkit::TempDir::new("foreign");
        let path = dir.path().join("state.db");
        sqlite(&path, GO_KINE_SCHEMA);
        sqlite(
            &path,
            "INSERT INTO kine (name, created, deleted, create_revision, prev_revision, lease, value) VALUES ('a', 1, 0, 0, 0, 0, x'00');",
        );
        let before = std::fs::read(&path).unwrap();
        let (k, found) = kind(check_sqlite(&path)).unwrap();
        assert_eq!(k, ForeignKind::GoKine);
        assert_eq!(found, "this SQLite database holds Go kine's data: table kine, 1 row, revision 1");
        assert_eq!(std::fs::read(&path).unwrap(), before);

        let legacy = dir.path().join("legacy.db");
        sqlite(
            &legacy,
            "CREATE TABLE key_value (name TEXT, value BLOB, revision INTEGER); INSERT INTO key_value VALUES ('a', x'00', 1), ('b', x'00', 2);",
        );
        let (k, found) = kind(check_sqlite(&legacy)).unwrap();
        assert_eq!(k, ForeignKind::GoKine);
        assert_eq!(found, "this SQLite database holds an old Go kine's data: table key_value, 2 rows");
    }

    /// Every file in `dir` and its bytes.
    fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
        let mut all: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| {
                let p = e.unwrap().path();
                (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap())
            })
            .collect();
        all.sort();
        all
    }

    #[test]
    fn looking_at_a_wal_database_writes_nothing_beside_it() {
        let dir = kine_testkit::TempDir::new("foreign-wal");
        // A clean WAL database: neither -wal nor -shm.
        let clean = dir.path().join("clean db?#%.db");
        sqlite(&clean, &format!("PRAGMA journal_mode = WAL; {GO_KINE_SCHEMA}"));
        // One whose writer stopped without closing it: its log and index are left (copied
        // while the writer has them open: files no connection of this process has open, as
        // another process's would be).
        let live = kine_testkit::TempDir::new("foreign-wal-writer");
        let writer = rusqlite::Connection::open(live.path().join("left.db")).unwrap();
        writer
            .execute_batch(&format!("PRAGMA journal_mode = WAL; PRAGMA wal_autocheckpoint = 0; {GO_KINE_SCHEMA}"))
            .unwrap();
        writer.execute_batch("INSERT INTO kine (name) VALUES ('a'), ('b');").unwrap();
        for suffix in ["", "-wal", "-shm"] {
            let name = format!("left.db{suffix}");
            std::fs::copy(live.path().join(&name), dir.path().join(&name)).unwrap();
        }
        let left = dir.path().join("left.db");
        let before = files(dir.path());
        assert!(before.iter().any(|(n, _)| n == "left.db-shm") && before.iter().any(|(n, _)| n == "left.db-wal"));
        for (path, rows) in [(&clean, 0), (&left, 2)] {
            let (k, found) = kind(check_sqlite(path)).unwrap();
            assert_eq!(k, ForeignKind::GoKine);
            assert!(found.contains(&format!("table kine, {}", row_count(rows))), "{found}");
        }
        let after = files(dir.path());
        let names = |f: &[(String, Vec<u8>)]| f.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
        assert_eq!(names(&after), names(&before), "nothing created");
        for ((name, a), (_, b)) in after.iter().zip(&before) {
            assert!(a == b, "{name} changed");
        }
        drop(writer);
    }

    #[test]
    fn go_kine_table_beside_a_kine_rs_store_is_served() {
        let dir = kine_testkit::TempDir::new("foreign");
        let path = dir.path().join("state.db");
        sqlite(&path, GO_KINE_SCHEMA);
        sqlite(&path, "CREATE TABLE meta (name TEXT PRIMARY KEY, value INTEGER); CREATE TABLE kv (x);");
        check_sqlite(&path).unwrap();
    }

    #[test]
    fn other_programs_tables_are_refused() {
        let dir = kine_testkit::TempDir::new("foreign");
        let path = dir.path().join("app.db");
        sqlite(&path, "CREATE TABLE users (id INTEGER); CREATE TABLE orders (id INTEGER);");
        let (k, found) = kind(check_sqlite(&path)).unwrap();
        assert_eq!(k, ForeignKind::Other);
        assert!(found.contains("tables of another program (orders, users)"), "{found}");
    }

    #[test]
    fn files_that_are_no_sqlite_database_are_refused_unchanged() {
        let dir = kine_testkit::TempDir::new("foreign");
        let random = dir.path().join("random.db");
        let bytes: Vec<u8> = (0..5000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        std::fs::write(&random, &bytes).unwrap();
        let (k, found) = kind(check_sqlite(&random)).unwrap();
        assert_eq!(k, ForeignKind::Other);
        assert!(found.contains("random.db is not a SQLite database (5,000 bytes"), "{found}");
        assert_eq!(std::fs::read(&random).unwrap(), bytes);

        // A database cut in half: its header counts more pages than the file has.
        let whole = dir.path().join("whole.db");
        sqlite(&whole, "PRAGMA page_size = 4096; CREATE TABLE t (v BLOB);");
        sqlite(
            &whole,
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100) \
             INSERT INTO t SELECT randomblob(1000) FROM n;",
        );
        let full = std::fs::read(&whole).unwrap();
        let cut = dir.path().join("cut.db");
        std::fs::write(&cut, &full[..full.len() / 2 / 4096 * 4096]).unwrap();
        let (k, found) = kind(check_sqlite(&cut)).unwrap();
        assert_eq!(k, ForeignKind::Other);
        assert!(found.contains("cut.db is a damaged SQLite database (truncated: its header counts"), "{found}");
        let short = dir.path().join("short.db");
        std::fs::write(&short, &full[..50]).unwrap();
        let (_, found) = kind(check_sqlite(&short)).unwrap();
        assert!(found.contains("truncated SQLite database (50 bytes"), "{found}");
    }

    #[test]
    fn etcd_files_are_named_as_etcd_s() {
        let dir = kine_testkit::TempDir::new("foreign");
        let data = dir.path().join("etcd");
        std::fs::create_dir_all(data.join("member/snap")).unwrap();
        std::fs::create_dir_all(data.join("member/wal")).unwrap();
        // bbolt's first meta page: page id, flags, count, overflow, then the magic.
        let mut db = vec![0u8; 8192];
        db[16..20].copy_from_slice(&BBOLT_MAGIC.to_le_bytes());
        std::fs::write(data.join("member/snap/db"), &db).unwrap();
        for path in [data.join("member/snap/db"), data.clone(), data.join("member"), data.join("state.db")] {
            let (k, found) = kind(check_sqlite(&path)).unwrap();
            assert_eq!(k, ForeignKind::Etcd, "{}", path.display());
            assert!(found.contains("etcd's data directory"), "{found}");
        }
        let copied = dir.path().join("snapshot.db");
        std::fs::write(&copied, &db).unwrap();
        let (k, found) = kind(check_sqlite(&copied)).unwrap();
        assert_eq!(k, ForeignKind::Etcd);
        assert!(found.contains("an etcd database file (bbolt"), "{found}");
        let a_dir = dir.path().join("somedir");
        std::fs::create_dir(&a_dir).unwrap();
        assert_eq!(kind(check_sqlite(&a_dir)).unwrap().0, ForeignKind::Other);
    }
}
