package org.sluice.peer;

import java.util.Map;

/** The interface APISIX's dubbo-proxy tests call: one Map in, one Map (status, headers, body) out. */
public interface DemoService {
    Map<String, Object> hello(Map<String, Object> context);
}
