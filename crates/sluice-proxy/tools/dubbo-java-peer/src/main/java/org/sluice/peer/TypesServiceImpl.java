package org.sluice.peer;

import java.util.ArrayList;
import java.util.Collections;
import java.util.Date;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

import org.apache.dubbo.rpc.RpcContext;

public class TypesServiceImpl implements TypesService {
    public int addInt(int a, int b) { return a + b; }
    public long nextLong(long v) { return v + 1; }
    public double half(double d) { return d / 2; }
    public boolean not(boolean b) { return !b; }
    public String greet(String name) { return "hello " + name; }
    public String greet(String name, int times) { return ("hello " + name + " ").repeat(times).trim(); }
    public String ping() { return "pong"; }

    public User older(User u) {
        User r = new User();
        r.setName(u.getName());
        r.setAge(u.getAge() + 1);
        r.setId(u.getId());
        List<String> tags = new ArrayList<>(u.getTags() == null ? List.of() : u.getTags());
        tags.add("older");
        r.setTags(tags);
        return r;
    }

    public List<Integer> reverse(List<Integer> xs) {
        List<Integer> r = new ArrayList<>(xs);
        Collections.reverse(r);
        return r;
    }

    public Map<String, Integer> doubled(Map<String, Integer> m) {
        Map<String, Integer> r = new LinkedHashMap<>();
        m.forEach((k, v) -> r.put(k, v * 2));
        return r;
    }

    public String describe(String s) { return s == null ? "null" : "string:" + s; }
    public String nothing() { return null; }
    public String fail(String message) { throw new IllegalStateException(message); }

    public String slow(int millis) {
        try {
            Thread.sleep(millis);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        return "slept " + millis;
    }

    public int length(String s) { return s.length(); }
    public String repeat(String unit, int times) { return unit.repeat(times); }

    public byte[] bytes(int n) {
        byte[] b = new byte[n];
        for (int i = 0; i < n; i++) b[i] = (byte) i;
        return b;
    }

    public Date date(long millis) { return new Date(millis); }

    /** An attachment the call carried. */
    public String attachment(String key) { return RpcContext.getServerAttachment().getAttachment(key); }

    private final Set<String> seen = ConcurrentHashMap.newKeySet();

    /** Sleeps on the first call for `key` only: a repeated call succeeds at once. */
    public String slowFirst(String key, int millis) {
        if (seen.add(key)) {
            slow(millis);
            return "first";
        }
        return "again";
    }
}
