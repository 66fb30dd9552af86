#include "server/coordinator_store.h"

#include <sqlite3.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace shardline::server {
namespace {

constexpr int kSchemaVersion = 1;

constexpr char kSchema[] = R"sql(
CREATE TABLE IF NOT EXISTS counters(name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS jobs(
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  id TEXT UNIQUE NOT NULL,
  spec BLOB NOT NULL,    -- shardline.v1.JobSpec
  status BLOB NOT NULL   -- shardline.v1.JobStatus
);
)sql";

// One prepared statement, finalized on scope exit.
class Statement {
 public:
  Statement(sqlite3* db, const char* sql) { rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr); }
  ~Statement() { sqlite3_finalize(stmt_); }
  bool ok() const { return rc_ == SQLITE_OK; }
  sqlite3_stmt* get() { return stmt_; }
  void Bind(int i, const std::string& text) { sqlite3_bind_text(stmt_, i, text.data(), static_cast<int>(text.size()), SQLITE_TRANSIENT); }
  void BindBlob(int i, const std::string& bytes) {
    sqlite3_bind_blob(stmt_, i, bytes.data(), static_cast<int>(bytes.size()), SQLITE_TRANSIENT);
  }
  std::string Blob(int column) {
    const void* data = sqlite3_column_blob(stmt_, column);
    return data == nullptr ? std::string() : std::string(static_cast<const char*>(data), sqlite3_column_bytes(stmt_, column));
  }

 private:
  sqlite3_stmt* stmt_ = nullptr;
  int rc_ = SQLITE_ERROR;
};

}  // namespace

absl::Status CoordinatorStore::Error(const char* what) {
  const int code = sqlite3_errcode(db_);
  const std::string message = absl::StrCat("coordinator state ", sqlite3_db_filename(db_, "main"), ": ", what, ": ",
                                           sqlite3_errmsg(db_));
  if (code == SQLITE_BUSY || code == SQLITE_LOCKED) {
    return absl::FailedPreconditionError(absl::StrCat(message, " (is another coordinator using this --state_dir?)"));
  }
  if (code == SQLITE_NOTADB || code == SQLITE_CORRUPT) return absl::DataLossError(message);
  return absl::InternalError(message);
}

absl::Status CoordinatorStore::Exec(const char* sql) {
  if (sqlite3_exec(db_, sql, nullptr, nullptr, nullptr) != SQLITE_OK) return Error(sql);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CoordinatorStore>> CoordinatorStore::Open(const std::string& path) {
  sqlite3* db = nullptr;
  const int rc = sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                                 nullptr);
  if (rc != SQLITE_OK) {
    const std::string message = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    sqlite3_close(db);
    return absl::InternalError(absl::StrCat("cannot open ", path, ": ", message));
  }
  std::unique_ptr<CoordinatorStore> store(new CoordinatorStore(db));
  absl::MutexLock lock(&store->mu_);
  // One coordinator per state: the exclusive lock is held from the first
  // write until the process ends.
  RETURN_IF_ERROR(store->Exec("PRAGMA locking_mode = EXCLUSIVE"));
  RETURN_IF_ERROR(store->Exec("PRAGMA journal_mode = WAL"));
  RETURN_IF_ERROR(store->Exec("PRAGMA synchronous = FULL"));
  RETURN_IF_ERROR(store->Exec("BEGIN EXCLUSIVE"));
  {
    Statement version(db, "PRAGMA user_version");
    if (!version.ok() || sqlite3_step(version.get()) != SQLITE_ROW) return store->Error("reading the schema version");
    const int64_t found = sqlite3_column_int64(version.get(), 0);
    if (found > kSchemaVersion) {
      return absl::FailedPreconditionError(absl::StrCat(path, " has schema version ", found,
                                                        "; this coordinator knows up to ", kSchemaVersion));
    }
  }
  RETURN_IF_ERROR(store->Exec(kSchema));
  RETURN_IF_ERROR(store->Exec(absl::StrCat("PRAGMA user_version = ", kSchemaVersion).c_str()));
  ASSIGN_OR_RETURN(store->incarnation_, store->Take("incarnation"));
  RETURN_IF_ERROR(store->Exec("COMMIT"));
  return store;
}

CoordinatorStore::~CoordinatorStore() {
  absl::MutexLock lock(&mu_);
  sqlite3_close(db_);
}

absl::StatusOr<int64_t> CoordinatorStore::Take(const char* name) {
  Statement update(db_,
                   "INSERT INTO counters(name, value) VALUES(?1, 2) "
                   "ON CONFLICT(name) DO UPDATE SET value = value + 1 RETURNING value - 1");
  if (!update.ok()) return Error("preparing a counter update");
  update.Bind(1, name);
  if (sqlite3_step(update.get()) != SQLITE_ROW) return Error(name);
  const int64_t value = sqlite3_column_int64(update.get(), 0);
  if (sqlite3_step(update.get()) != SQLITE_DONE) return Error(name);
  return value;
}

absl::StatusOr<int64_t> CoordinatorStore::TakeJobNumber() {
  absl::MutexLock lock(&mu_);
  return Take("next_job");
}

absl::StatusOr<uint64_t> CoordinatorStore::TakeEpoch() {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(int64_t epoch, Take("next_epoch"));
  return static_cast<uint64_t>(epoch);
}

absl::Status CoordinatorStore::SaveJob(const shardline::v1::JobSpec& spec, const shardline::v1::JobStatus& status) {
  absl::MutexLock lock(&mu_);
  Statement upsert(db_,
                   "INSERT INTO jobs(id, spec, status) VALUES(?1, ?2, ?3) "
                   "ON CONFLICT(id) DO UPDATE SET spec = excluded.spec, status = excluded.status");
  if (!upsert.ok()) return Error("preparing a job update");
  upsert.Bind(1, status.job_id());
  upsert.BindBlob(2, spec.SerializeAsString());
  upsert.BindBlob(3, status.SerializeAsString());
  if (sqlite3_step(upsert.get()) != SQLITE_DONE) return Error("saving a job");
  return absl::OkStatus();
}

absl::Status CoordinatorStore::DeleteJob(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  Statement remove(db_, "DELETE FROM jobs WHERE id = ?1");
  if (!remove.ok()) return Error("preparing a job deletion");
  remove.Bind(1, job_id);
  if (sqlite3_step(remove.get()) != SQLITE_DONE) return Error("deleting a job");
  if (sqlite3_changes(db_) == 0) return absl::NotFoundError(absl::StrCat("no saved job '", job_id, "'"));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<CoordinatorStore::StoredJob>> CoordinatorStore::LoadJobs() {
  absl::MutexLock lock(&mu_);
  Statement select(db_, "SELECT id, spec, status FROM jobs ORDER BY seq");
  if (!select.ok()) return Error("preparing the job list");
  std::vector<StoredJob> jobs;
  int rc;
  while ((rc = sqlite3_step(select.get())) == SQLITE_ROW) {
    StoredJob job;
    if (!job.spec.ParseFromString(select.Blob(1)) || !job.status.ParseFromString(select.Blob(2))) {
      return absl::DataLossError(absl::StrCat("coordinator state: the record of job ", select.Blob(0),
                                              " does not parse"));
    }
    jobs.push_back(std::move(job));
  }
  if (rc != SQLITE_DONE) return Error("listing jobs");
  return jobs;
}

}  // namespace shardline::server
