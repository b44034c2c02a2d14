// Test hook for the rendezvous: closes a TcpStore's connection the way a dead process does,
// without the goodbye its destructor sends, so the server marks its rank lost.
#pragma once

#include <memory>

#include "strata/comm/tcp_store.h"

namespace strata::testing {

// Closes `store`'s connection without a goodbye and destroys it (a store not made by
// TcpStore::connect is just destroyed).
void drop_without_goodbye(std::unique_ptr<TcpStore> store);

}  // namespace strata::testing
