import { createContext, useContext } from "react";
import type { Role } from "./api";

export const RoleContext = createContext<Role>("viewer");
export const useRole = () => useContext(RoleContext);
