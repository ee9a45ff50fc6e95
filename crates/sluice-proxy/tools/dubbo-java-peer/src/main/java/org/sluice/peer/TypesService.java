package org.sluice.peer;

import java.util.Date;
import java.util.List;
import java.util.Map;

/** One method per shape a generic call must get right. */
public interface TypesService {
    int addInt(int a, int b);
    long nextLong(long v);
    double half(double d);
    boolean not(boolean b);
    String greet(String name);
    String greet(String name, int times);
    String ping();
    User older(User u);
    List<Integer> reverse(List<Integer> xs);
    Map<String, Integer> doubled(Map<String, Integer> m);
    String describe(String s);
    String nothing();
    String fail(String message);
    String slow(int millis);
    int length(String s);
    String repeat(String unit, int times);
    byte[] bytes(int n);
    Date date(long millis);
    String attachment(String key);
    String slowFirst(String key, int millis);
}
