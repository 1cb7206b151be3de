#pragma once
// The claim check in outboxd's configuration (claim_check.h says what it does): a sub-table of any
// sink's table, read here for every sink type, so that outboxd wraps the sink it opens.
//
//   [sinks.<name>.claim_check]
//   endpoint = "https://s3.eu-west-1.amazonaws.com"  # required: scheme://host[:port]
//   bucket = "orders-payloads"   # required
//   region = "us-east-1"         # signed into every request
//   url_style = "path"           # or "virtual": https://<bucket>.<endpoint host>/<key>
//   prefix = "outbox/"           # object key = prefix + message id
//   threshold = 262144           # payloads over this many bytes are stored (1 to 5 GiB)
//   retention = "0s"             # "7d": delete the prefix's objects older than that; "0s": none
//   access_key_id = "AKIA..."    # credentials: in the file, or
//   secret_access_key = "..."    #   OUTBOX_SINK_<NAME>_CLAIM_CHECK_SECRET_ACCESS_KEY, or
//   secret_access_key_file = ""  #   a file holding it; none of these and no access_key_id:
//   session_token = ""           #   AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN
//   ca_file = ""                 # PEM CA certificates to trust (empty: the system's)
//   connect_timeout = "5s"
//   request_timeout = "60s"      # one upload, at most (and never past the publish deadline)
//   enabled = true               # false: the table is ignored (and a global one not used)
//
// A top-level [claim_check] table with the same keys is the default of every sink: a sink without
// a table of its own uses it; one with a table reads its keys over it.
//
// The secret and the session token are shown as *** by --check-config and are given to the
// process's redactor.

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "outbox/config/toml_table.h"
#include "outbox/sink/claim_check.h"
#include "outbox/sink/registry.h"

namespace outbox::claim_check {

// The key of the sub-table in a [sinks.<name>] table.
inline constexpr std::string_view kTableKey = "claim_check";

// Reads the claim_check sub-table of sink `sink_name` over `defaults` (the global [claim_check]
// table's options: a key the sink's table sets wins, one it leaves out keeps the default);
// nullopt when it says enabled = false. An empty `sink_name` reads the global table, whose
// secrets may come from OUTBOX_CLAIM_CHECK_SECRET_ACCESS_KEY and OUTBOX_CLAIM_CHECK_SESSION_TOKEN.
// Throws ConfigError naming the key for anything wrong.
std::optional<Options> ReadOptions(const config::Section& table, std::string_view sink_name,
                                   const config::GetenvFn& getenv,
                                   const std::optional<Options>& defaults = std::nullopt);
// The keys ReadOptions read, with their effective values, secrets masked.
void DescribeOptions(config::TomlWriter& out, const Options& options);

// `inner` whose sink is opened with the claim-check step in front (WrapSink). It describes itself
// as `inner` followed by a [sinks.<name>.claim_check] table.
std::unique_ptr<const SinkSettings> WithClaimCheck(std::unique_ptr<const SinkSettings> inner,
                                                   std::string sink_name, Options options);

}  // namespace outbox::claim_check
