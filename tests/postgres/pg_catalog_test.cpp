// The PostgreSQL catalog of outboxd's [discovery] (outbox/store/postgres_catalog.h): its rows, and
// what it says of a query that does not answer as a catalog must, or of a catalog it cannot reach.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "outbox/core/error.h"
#include "outbox/store/postgres_catalog.h"
#include "support/pg_test_support.h"

namespace outbox::testing {
namespace {

using std::chrono::seconds;

class PgCatalogTest : public ::testing::Test {
 protected:
  TestSchema schema_;  // the catalog's table lives in the test's schema

  void SetUp() override {
    Sql(schema_.conn(), "CREATE TABLE " + schema_.name() +
                            ".tenants (name text, url text, schema text, active boolean)");
    Sql(schema_.conn(), "INSERT INTO " + schema_.name() +
                            ".tenants VALUES ('a', 'postgresql://db/a', NULL, true), "
                            "('b', 'postgresql://db/b', 'events', true), "
                            "('c', 'postgresql://db/c', NULL, false)");
  }
  std::string Table() const { return schema_.name() + ".tenants"; }
};

TEST_F(PgCatalogTest, ReadsNameUrlAndTheOptionalSchemaByColumnName) {
  // Columns taken by name, in any order; a NULL schema is the default.
  auto catalog = OpenPostgresCatalog(
      PgUrl(), "SELECT schema, url, name FROM " + Table() + " WHERE active ORDER BY name",
      seconds{5});
  const auto rows = catalog->Read();
  ASSERT_EQ(rows.size(), 2U);
  EXPECT_EQ(rows[0].name, "a");
  EXPECT_EQ(rows[0].url, "postgresql://db/a");
  EXPECT_FALSE(rows[0].schema);
  EXPECT_EQ(rows[1].schema, "events");
  // Read again on the same connection: what changed is seen.
  Sql(schema_.conn(), "UPDATE " + Table() + " SET active = true WHERE name = 'c'");
  EXPECT_EQ(catalog->Read().size(), 3U);
  // Without a schema column, every row has the default.
  const auto plain =
      OpenPostgresCatalog(PgUrl(), "SELECT name, url FROM " + Table(), seconds{5})->Read();
  ASSERT_EQ(plain.size(), 3U);
  EXPECT_FALSE(plain[1].schema);
}

TEST_F(PgCatalogTest, AQueryWithoutNameOrUrlOrWithNullsIsAConfigurationError) {
  const auto fails = [&](const std::string& query, const std::string& fragment) {
    try {
      (void)OpenPostgresCatalog(PgUrl(), query, seconds{5})->Read();
      ADD_FAILURE() << "no error for " << query;
    } catch (const ConfigError& error) {
      EXPECT_EQ(error.key(), "query") << error.what();
      EXPECT_NE(std::string{error.what()}.find(fragment), std::string::npos) << error.what();
    }
  };
  fails("SELECT name FROM " + Table(), "must return the columns name and url");
  fails("SELECT url AS address, name FROM " + Table(), "must return the columns name and url");
  fails("SELECT name, NULL::text AS url FROM " + Table(), "row 1 has a null name or url");
  // A query the database refuses, and a catalog it cannot reach: StoreError, tried again later.
  EXPECT_THROW(
      (void)OpenPostgresCatalog(PgUrl(), "SELECT name, url FROM nowhere", seconds{5})->Read(),
      StoreError);
  EXPECT_THROW((void)OpenPostgresCatalog("postgresql://u:pw@127.0.0.1:1/x?connect_timeout=2",
                                         "SELECT 1", seconds{5})
                   ->Read(),
               StoreError);
}

}  // namespace
}  // namespace outbox::testing
