package org.sluice.peer;

import java.io.Serializable;
import java.util.List;

/** A POJO argument and result. */
public class User implements Serializable {
    private String name;
    private int age;
    private long id;
    private List<String> tags;

    public String getName() { return name; }
    public void setName(String name) { this.name = name; }
    public int getAge() { return age; }
    public void setAge(int age) { this.age = age; }
    public long getId() { return id; }
    public void setId(long id) { this.id = id; }
    public List<String> getTags() { return tags; }
    public void setTags(List<String> tags) { this.tags = tags; }
}
