#pragma once
// An AMQP URL fit to show (outboxd --check-config, configuration errors): masked by parsing it
// with librabbitmq's amqp_parse_url, the parser the sink connects with, not by looking for
// patterns.

#include <string>
#include <string_view>

namespace outbox::rabbitmq {

// `url` with its password replaced by ***.
//  - amqp:// and amqps:// URLs go through amqp_parse_url (on a copy: it parses in place), so what
//    is masked is exactly what the sink would send as the password. The result keeps the form the
//    user wrote, only the password's text (between the first ':' of the user info and its '@')
//    replaced, and is accepted when amqp_parse_url reads it back as the same user, host, port and
//    vhost with the password ***; otherwise it is rebuilt as amqp[s]://user:***@host:port/vhost
//    (user and vhost percent-encoded). A URL without a password comes back unchanged. A URL
//    amqp_parse_url refuses is shown as its scheme and *** only ("amqp://***").
//  - Anything else is no AMQP URL; it is masked as free text (config::MaskPassword).
std::string MaskAmqpUrl(std::string_view url);

}  // namespace outbox::rabbitmq
