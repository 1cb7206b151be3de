#pragma once
// A PostgreSQL connection string fit to show (outboxd --check-config, messages): masked by
// parsing it the way the store will, with libpq's PQconninfoParse, not by looking for patterns.

#include <string>
#include <string_view>
#include <vector>

namespace outbox::postgres {

// `conninfo`, a libpq URI (postgresql://, postgres://) or key=value string, with the value of
// every option libpq itself hides (password, sslpassword: PQconninfoOption::dispchar "*")
// replaced by ***:
//  - in the form the user wrote it when that can be done exactly: each secret's text is replaced
//    where libpq's grammar puts it (the URI's user info, a query parameter, a key=value value,
//    quotes and backslash escapes included), and the result is accepted only when libpq parses it
//    to the same options with *** for the secrets;
//  - otherwise rebuilt as an equivalent key=value string from the parsed options, values quoted
//    the way libpq reads them ('...' with \\ and \').
// A string without secrets comes back unchanged. A string libpq cannot parse, or one whose parse
// shows a password where it does not belong (a port that is not a number, an '@' past the URI's
// user info, as in postgresql://u:p#ss/w@host/db, which libpq reads as host "u", port "p#ss"), is
// not shown beyond its scheme: "postgresql://*** (not a valid connection string: <libpq's reason,
// its quoted fragments hidden>)"; "*** (...)" for a key=value string.
std::string MaskConninfo(std::string_view conninfo);

// The secrets of `conninfo` (those MaskConninfo hides) as libpq reads them and as the string
// spells them, and a URI's user info in the forms of UrlSecretForms (core/secrets.h); none for a
// string libpq cannot parse (only the user info's forms).
std::vector<std::string> ConninfoSecrets(std::string_view conninfo);

}  // namespace outbox::postgres
