#include "outbox/core/clock.h"

namespace outbox {

const SystemClock& SystemClock::Instance() {
  static const SystemClock instance;
  return instance;
}

}  // namespace outbox
