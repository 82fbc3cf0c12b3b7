// The polyfills go in first, before anything imports the core (see polyfills.js).
import "./polyfills";
import { AppRegistry } from "react-native";
import App from "./App";
import { name } from "./app.json";

AppRegistry.registerComponent(name, () => App);
