package org.sluice.peer;

import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;
import java.util.TreeMap;

public class DemoServiceImpl implements DemoService {
    @Override
    public Map<String, Object> hello(Map<String, Object> context) {
        StringBuilder sb = new StringBuilder("java dubbo\n");
        for (Map.Entry<String, Object> e : new TreeMap<>(context).entrySet()) {
            Object v = e.getValue();
            String shown = v instanceof byte[] ? new String((byte[]) v, StandardCharsets.UTF_8) : String.valueOf(v);
            sb.append(e.getKey()).append(": ").append(shown).append('\n');
        }
        Map<String, Object> ret = new HashMap<>();
        Object status = context.get("x-status");
        ret.put("status", status == null ? "200" : status.toString());
        ret.put("x-provider", "java");
        // Which provider answered (the discovery tests run several).
        ret.put("x-provider-port", System.getProperty("port", ""));
        ret.put("body", sb.toString().getBytes(StandardCharsets.UTF_8));
        return ret;
    }
}
